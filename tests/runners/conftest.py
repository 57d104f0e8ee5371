"""The runner tests use the run-wide ``spark`` and ``dask_client`` fixtures of tests/conftest.py."""
