"""``hora.runner``: Horovod's ``horovod.runner`` import paths (hora's launchers are :mod:`hora.runners`).

``hora.runner.mpi_run.is_open_mpi``, ``hora.runner.util.threads.in_thread`` and
``hora.runner.common.util.secret.make_secret_key`` are here for programs that import them;
``hora run`` and :func:`hora.run` start the ranks.
"""
