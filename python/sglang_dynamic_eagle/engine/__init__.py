"""The decode engine inside sglang's scheduler: the worker that dispatches each decode step
(``worker``), what it builds at start-up (``startup``), the plain step and its CUDA graphs
(``plain_step``, ``plain_decode_graphs``), the draft-KV catch-up (``draft_catchup``), what it
tells the policy (``observations``) and the step timing (``step_costs``)."""
