"""Where ranks run: one module per launcher (local, hosts over ssh, mpi, Spark, Dask,
Ray). Each is named in :data:`hora.runners.launcher.BUILTIN` and imported only when used."""
