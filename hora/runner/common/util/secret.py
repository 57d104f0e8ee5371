"""``hora.runner.common.util.secret``: a job's secret key (Horovod's ``make_secret_key``).

hora signs every control-plane message with a per-job secret (:mod:`hora.native.rendezvous`).
"""

from hora.native.rendezvous.contract import make_secret

#: Horovod's name
make_secret_key = make_secret

__all__ = ["make_secret_key"]
