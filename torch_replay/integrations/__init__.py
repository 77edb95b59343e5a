"""Where users turn checkpointing on: one module per library
(``torch_replay.integrations.transformers``); torch.distributed's wrapper API is
``tr.checkpoint_wrapper`` / ``tr.apply_activation_checkpointing``. See
``docs/integrations.md``."""

__all__: list[str] = []
