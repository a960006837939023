"""The software verbs provider's error (pyverbs ``pyverbs.pyverbs_error``: ``PyverbsRDMAError``,
``PyverbsUserError``): one class, so that every module of the provider can raise it without importing another's."""


class SimVerbsError(RuntimeError):
    """What pyverbs raises as PyverbsRDMAError / PyverbsUserError: a verb refused at call time."""
