"""A rank's side of a run: its entry (:mod:`.main`, ``python -m hora.runners.rank.main``),
the entry as a subprocess of a Spark or Dask task (:mod:`.supervise`), process groups (:mod:`.procs`), the host supervisor (:mod:`.remote`) reached over ssh
(:mod:`.ssh`), and the warm interpreter pool (:mod:`.warm`)."""
