"""Ranks as Ray actors: the launcher (:mod:`.launcher`), placement groups
(:mod:`.placement`) and the rank actors (:mod:`.workers`). Needs the ``hora[ray]`` extra."""
