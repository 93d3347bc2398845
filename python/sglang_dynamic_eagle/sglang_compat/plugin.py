"""sglang plugin entry point (group ``sglang.srt.plugins``).

sglang calls ``register()`` through ``load_plugins()`` in every process that
matters: the launcher before it parses arguments, and each scheduler
subprocess before it builds its workers.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Type

from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from sglang.srt.speculative.spec_registry import get_spec

from sglang_dynamic_eagle.policy import ALGORITHM_NAME
from sglang_dynamic_eagle.sglang_compat import launcher, registry
from sglang_dynamic_eagle.sglang_compat.spec_algo import DynamicEagleSpecAlgo

if TYPE_CHECKING:
    from sglang.srt.server_args import ServerArgs

logger = logging.getLogger(__name__)


def _worker_class(server_args: ServerArgs) -> Type:
    """The worker class, called in each scheduler process right before it builds its worker:
    start-up refuses there, with one line, an sglang whose internals are not those of the
    registry. With ``SGLANG_DYNAMIC_EAGLE_SYNC_CHECK=1``, the worker with the host-sync check."""
    registry.check_at_start_up()
    # Imported here: the worker pulls in torch kernels that the launcher process (argument
    # parsing, --help) never needs.
    from sglang_dynamic_eagle.config import load_config
    from sglang_dynamic_eagle.engine.worker import DynamicEagleWorker
    from sglang_dynamic_eagle.observability.host_syncs import with_host_sync_check

    if load_config().sync_check:
        return with_host_sync_check(DynamicEagleWorker)
    return DynamicEagleWorker


def _validate_server_args(server_args: ServerArgs) -> None:
    """Runs inside ``ServerArgs.__post_init__``, after ``load_plugins()`` applied the hooks."""
    registry.check_hooks_in_effect()
    launcher.validate_server_args(server_args)
    window = getattr(server_args, "speculative_draft_window_size", None)
    if window is not None:
        # sglang warns, just before this, that the flag has no effect (registry: server).
        logger.info("EAGLE3_DYNAMIC: --speculative-draft-window-size %d applies as under EAGLE3: "
                    "a Llama EAGLE-3 draft (sglang's LlamaForCausalLMEagle3) reads it whatever "
                    "the algorithm's name; other drafts ignore it.", window)


def register() -> None:
    """Register EAGLE3_DYNAMIC, its flags and its hooks. Idempotent.

    It leaves ``sys.excepthook`` alone: the one-line printing of start-up refusals is installed
    by the launcher hook, and only for a command line that selects EAGLE3_DYNAMIC
    (``launcher.around_from_cli_args``)."""
    if get_spec(ALGORITHM_NAME) is not None:
        return
    SpeculativeAlgorithm.register(
        ALGORITHM_NAME,
        supports_overlap=True,
        validate_server_args=_validate_server_args,
        spec_class=DynamicEagleSpecAlgo,
    )(_worker_class)
    registry.install_hooks()
    logger.debug("Registered speculative algorithm %s", ALGORITHM_NAME)
