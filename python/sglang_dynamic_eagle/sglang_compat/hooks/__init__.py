"""The HookRegistry hooks that run while the server serves (``registry.HOOKS`` installs them with
the command-line hooks of ``launcher``): the report in ``/server_info``, the decode log line
and metrics (``reporting``); the scheduler's chosen batch and queue to the worker, which decides
the step there (``batch_selection``); the token-id guard (``request_guards``); the prefill's
tail tokens without a host sync (``prefill_tail_tokens``)."""
