"""PyTorch in the estimators.

* :mod:`~hora.estimators.frameworks.torch.codec` - the configuration, the driver's codec and the descriptor ``TORCH``
* :mod:`~hora.estimators.frameworks.torch.session` - a rank's training session
* :mod:`~hora.estimators.frameworks.torch.strategies` - ``strategy=``: hora, ZeRO, DDP, FSDP
* :mod:`~hora.estimators.frameworks.torch.tensors` - batches to tensors, labels, parameter dtypes
* :mod:`~hora.estimators.frameworks.torch.dcp` - FSDP's distributed checkpoint through the Store
* :mod:`~hora.estimators.frameworks.torch.hf` - Hugging Face models: keyword tensors, their own loss, LoRA, export
"""
