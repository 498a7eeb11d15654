"""``toolwitness bench``: the benchmark suite. Each command prints ONE table of figures measured in
that run (ratios where the machine is noisy), shows a progress bar on stderr, and takes ``--json``.

Run against the local Kafka and Redis (``make services-up``; env ``TOOLWITNESS_KAFKA_BOOTSTRAP`` /
``TOOLWITNESS_REDIS_URL`` honoured). Exit code: 0 every target met, 1 a target missed, 2 the run
failed. Defaults keep each suite to ~1-3 minutes on a 2-core machine; the flags give the issue's
full sizes.

=====================================  ==========================================================
command                                figures
=====================================  ==========================================================
``toolwitness bench pipeline``         floor (aiokafka consume + decode) vs end to end spans/s and
                                       their ratio; the same backlog through 1 and 2 service
                                       processes (``--instances 1,2``) with the CPU each process,
                                       Redis and Kafka used (what bounded it); time to verdict
                                       p50/p95/p99 at ``--rate``; Redis bytes per trace;
                                       ``--profile FILE`` writes a pyinstrument profile of the
                                       end-to-end pass
``toolwitness bench verdict-latency``  p50/p95/p99/max time to verdict at ``--rates 1000,2500,5000``
``toolwitness bench state``            Redis bytes per active trace and per tool execution; growth
                                       with active traces and expectations (full sizes:
                                       ``--max-traces 100000 --max-expectations 100000``);
                                       reclamation of decided, complete traces
``toolwitness bench growth``           spans/s as trace size (``--sizes 5,25,100,500``) and active
                                       expectations grow (full: ``--max-expectations 100000``),
                                       said linear / better / super-linear
``toolwitness bench vs-tailsampling``  builds (cached) the Collector of
                                       deploy/collector/tailsampling and compares spans/s, time to
                                       decision and memory per trace on the same topic
                                       (``--decision-wait 30s``)
``toolwitness bench all``              every suite above in turn (``--json``: one document)
=====================================  ==========================================================
"""
