"""The router bench (``bench/bench_router.py``, which documents what it measures), in parts:
``procs`` starts and stops the child processes, ``cluster`` the redis-server and clusters,
``load`` the open- and closed-loop clients, ``phases`` the rounds, ``index`` the index
phase, ``report`` the summaries and the JSON result, ``run`` the whole sequence."""
