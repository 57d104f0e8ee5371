"""``hora.runner.common``: Horovod's ``horovod.runner.common`` path (:mod:`.util.secret`)."""
