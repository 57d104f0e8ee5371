"""``hora.runner.util``: Horovod's ``horovod.runner.util`` path (:mod:`.threads`)."""
