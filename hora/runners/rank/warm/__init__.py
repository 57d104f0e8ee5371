"""Warm interpreters: a forkserver that preloads the rank entry (:mod:`.server`) and the
launcher's side of it (:mod:`.client`)."""
