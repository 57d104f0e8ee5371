"""``hora.common``: Horovod's ``horovod.common`` path (:mod:`hora.common.util`)."""
