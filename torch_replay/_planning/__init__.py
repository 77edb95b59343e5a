"""The machinery of planning (private: import from ``torch_replay``).

``runner`` runs a sequence of segments with one option each and profiles a step;
``peak`` measures live bytes; ``layer_order`` is the exact ordered planner's Python side;
``kernel_timing`` times a callable's device kernels (CUPTI on CUDA, wall time elsewhere).
Names shared inside this folder carry no underscore.
"""
