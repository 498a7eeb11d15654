"""PyRIT's module paths for scorer evaluation (seed 004 imports from them); the code lives in
:mod:`scoring.evaluation` and :mod:`scoring.score.evaluable`."""
