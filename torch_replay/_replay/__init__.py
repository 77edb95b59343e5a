"""The machinery of checkpointing (private: import from ``torch_replay``).

Modules in the order a call travels: ``api`` (``checkpoint()``, parsing torch's and our
options) → ``config`` (the process-wide settings) → ``segment`` (the Transaction, state
collection, the settings a segment carries) → ``nonreentrant`` / ``reentrant`` (the two
ways a segment is saved and re-run) or ``compiled`` (under ``torch.compile``) →
``observe`` (the observer of operators), ``naming`` (what an error names), ``fsdp`` (FSDP2's
traffic hidden from the observer), ``drop_in`` (torch's signature, read from the installed
torch), ``replace`` (``replace_torch_checkpoint``: torch's names rebound to
``checkpoint()`` for one block). Names shared inside this folder carry no underscore; nothing outside
``torch_replay`` should import from here.
"""
