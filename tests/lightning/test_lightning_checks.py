"""hora.lightning's checks, in this process (no ranks started, hora not initialized):
``validate_trainer_args`` on bad modules, keys and values; the Strategy's arguments and the
choice between the two Lightning import names; ``fit_module``'s argument errors."""

from __future__ import annotations

import importlib
import importlib.util
import pickle

import pytest
import torch

from hora.errors import ConfigError
from tests.lightning import workers as W

PACKAGES = [pytest.param(p, marks=pytest.mark.skipif(importlib.util.find_spec(p) is None,
                                                       reason=f"{p} is not installed"))
            for p in ("lightning", "pytorch_lightning")]
BOTH = all(importlib.util.find_spec(p) is not None for p in ("lightning", "pytorch_lightning"))

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(params=PACKAGES)
def c(request):
    return W.classes(request.param)


def test_validate_accepts_and_normalizes(c):
    from hora.lightning import validate_trainer_args

    cb = c.EpochStarts()
    csv = c.pl.loggers.CSVLogger(save_dir="/nonexistent-never-written")
    cfg = validate_trainer_args(c.Regression(), {"max_epochs": 3, "accumulate_grad_batches": 2,
                                                 "gradient_clip_val": 0.5, "precision": "bf16-mixed",
                                                 "limit_train_batches": 0.5, "log_every_n_steps": 1,
                                                 "callbacks": [cb], "logger": csv})
    assert cfg.callbacks == [cb] and cfg.loggers == [csv]
    assert cfg.trainer_args == {"max_epochs": 3, "accumulate_grad_batches": 2, "gradient_clip_val": 0.5,
                                "precision": "bf16-mixed", "limit_train_batches": 0.5, "log_every_n_steps": 1}
    assert cfg.package == ("lightning" if c.pl.__name__ == "lightning.pytorch" else "pytorch_lightning")


@pytest.mark.parametrize("args,match", [
    ({"strategy": "ddp"}, r"trainer_args\['strategy'\].*hora owns the strategy"),
    ({"max_epoch": 3}, r"'max_epoch' is not a parameter of .*Trainer \(did you mean 'max_epochs'\?\)"),
    ({"devices": 2}, r"trainer_args\['devices'\]=2"),
    ({"num_nodes": 2}, r"trainer_args\['num_nodes'\]=2"),
    ({"accumulate_grad_batches": 0}, r"accumulate_grad_batches"),
    ({"accumulate_grad_batches": {0: 2}}, r"accumulate_grad_batches.*GradientAccumulationScheduler"),
    ({"gradient_clip_val": -1.0}, r"gradient_clip_val"),
    ({"gradient_clip_algorithm": "max"}, r"gradient_clip_algorithm"),
    ({"precision": "17-mixed"}, r"trainer_args\['precision'\]='17-mixed'"),
    ({"limit_train_batches": 1.5}, r"limit_train_batches"),
    ({"log_every_n_steps": -1}, r"log_every_n_steps"),
    ({"max_epochs": "3"}, r"max_epochs"),
    ("slurm", r"trainer_args\['plugins'\]\[0\] is a cluster environment \(SLURMEnvironment\)"),
])
def test_bad_trainer_args_name_the_key(c, args, match):
    from hora.lightning import validate_trainer_args

    if args == "slurm":
        fabric = "lightning.fabric" if c.pl.__name__ == "lightning.pytorch" else "lightning_fabric"
        args = {"plugins": [importlib.import_module(f"{fabric}.plugins.environments").SLURMEnvironment()]}
    with pytest.raises(ConfigError, match=match):
        validate_trainer_args(c.Regression(), args)


def test_bad_modules_and_objects(c):
    from hora.lightning import validate_trainer_args

    with pytest.raises(ConfigError, match=r"NoOptimizers does not define configure_optimizers\(\)"):
        validate_trainer_args(c.NoOptimizers())
    with pytest.raises(ConfigError, match=r"must be a LightningModule.*torch.nn.modules.linear.Linear"):
        validate_trainer_args(torch.nn.Linear(2, 2))
    with pytest.raises(ConfigError, match=r"trainer_args must be a dict"):
        validate_trainer_args(c.Regression(), [("max_epochs", 1)])
    with pytest.raises(ConfigError, match=r"callbacks\[0\] must be a .*Callback"):
        validate_trainer_args(c.Regression(), callbacks=[object()])
    with pytest.raises(ConfigError, match=r"given both as callbacks= and in trainer_args"):
        validate_trainer_args(c.Regression(), {"callbacks": [c.EpochStarts()]}, callbacks=[c.EpochStarts()])
    with pytest.raises(ConfigError, match=r"data_module must be a .*LightningDataModule"):
        validate_trainer_args(c.Regression(), data_module=object())


@pytest.mark.skipif(not BOTH, reason="needs both lightning and pytorch_lightning")
def test_objects_from_the_other_package_are_refused():
    from hora.lightning import validate_trainer_args

    a, b = W.classes("lightning"), W.classes("pytorch_lightning")
    with pytest.raises(ConfigError, match=r"callbacks\[0\] is a pytorch_lightning EpochStarts, but the module is a "
                                          r"lightning LightningModule"):
        validate_trainer_args(a.Regression(), callbacks=[b.EpochStarts()])
    with pytest.raises(ConfigError, match=r"data_module is a lightning Data"):
        validate_trainer_args(b.Regression(), data_module=a.Data())


def test_strategy_arguments():
    import hora.lightning

    with pytest.raises(ConfigError, match=r"package='nope' is not a Lightning import name"):
        hora.lightning.Strategy(package="nope")
    with pytest.raises(ConfigError, match=r"scale_lr must be True or False"):
        hora.lightning.Strategy(scale_lr="yes", package="lightning" if importlib.util.find_spec("lightning")
                                else "pytorch_lightning")
    with pytest.raises(ConfigError, match=r"must not set backward_passes_per_step"):
        hora.lightning.Strategy(distributed_optimizer_kwargs={"backward_passes_per_step": 2},
                                package="lightning" if importlib.util.find_spec("lightning") else "pytorch_lightning")
    import hora.native as hn

    assert not hn.is_initialized()  # every error above came before hora.init()


@pytest.mark.parametrize("package", PACKAGES)
def test_strategy_class_per_package(package):
    import importlib

    import hora.lightning
    from hora.lightning.strategy import strategy_class

    pl = importlib.import_module("lightning.pytorch" if package == "lightning" else "pytorch_lightning")
    cls = strategy_class(package)
    assert issubclass(cls, hora.lightning.Strategy) and issubclass(cls, pl.strategies.ParallelStrategy)
    assert hora.lightning.HoraStrategy is hora.lightning.Strategy
    assert pickle.loads(pickle.dumps(cls)) is cls


@pytest.mark.skipif(not BOTH, reason="needs both lightning and pytorch_lightning")
def test_both_packages_imported_needs_package_or_a_hint():
    import hora.lightning
    from hora.lightning._compat import resolve_flavor

    W.classes("lightning"), W.classes("pytorch_lightning")  # both imported now
    with pytest.raises(ConfigError, match=r"both `lightning` and `pytorch_lightning` are imported.*package="):
        hora.lightning.Strategy()
    import pytorch_lightning

    assert resolve_flavor(hints=[pytorch_lightning.plugins.precision.Precision()]).name == "pytorch_lightning"
    with pytest.raises(ConfigError, match=r"package='lightning', but the Precision given comes from pytorch_lightning"):
        resolve_flavor("lightning", hints=[pytorch_lightning.plugins.precision.Precision()])


def test_fit_module_argument_errors(c):
    from hora.lightning import fit_module

    batches = W.rank_batches(0, 1)
    with pytest.raises(ConfigError, match=r"one-shot iterator"):
        fit_module(c.Regression(), iter(batches), epochs=2)
    with pytest.raises(ConfigError, match=r"needs epochs="):
        fit_module(c.Regression(), batches)
    with pytest.raises(ConfigError, match=r"ckpt_path or ckpt_bytes, not both"):
        fit_module(c.Regression(), batches, epochs=1, ckpt_path="x.ckpt", ckpt_bytes=b"x")
    with pytest.raises(ConfigError, match=r"or data_module, not both"):
        fit_module(c.Regression(), batches, epochs=1, data_module=c.Data())
    with pytest.raises(ConfigError, match=r"train_batches must be an iterable of batches"):
        fit_module(c.Regression(), 42, epochs=1)
    with pytest.raises(ConfigError, match=r"hora owns the strategy"):
        fit_module(c.Regression(), batches, epochs=1, trainer_args={"strategy": "ddp"})
    import hora.native as hn

    assert not hn.is_initialized()
