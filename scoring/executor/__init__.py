"""Attack executors (PyRIT's ``pyrit.executor``)."""
