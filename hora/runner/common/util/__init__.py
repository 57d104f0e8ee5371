"""``hora.runner.common.util``: Horovod's path to :mod:`.secret`."""
