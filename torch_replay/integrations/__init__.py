"""Where users turn checkpointing on: one module per library
(``torch_replay.integrations.transformers``, ``torch_replay.integrations.timm``,
``torch_replay.integrations.torchtitan``, which imports torchtitan);
torch.distributed's wrapper API is
``tr.checkpoint_wrapper`` / ``tr.apply_activation_checkpointing``; any other library that
calls torch's checkpoint itself: ``tr.replace_torch_checkpoint()``. See
``docs/integrations.md``."""

__all__: list[str] = []
