"""Where this package meets sglang: the plugin entry point (``plugin``), the algorithm object
(``spec_algo``), the flags on sglang's command line and the checks of server arguments in the
launcher (``launcher``, ``unsupported``, ``gpu_check``, ``startup_errors``), the hooks
(``hooks``), and the registry of every sglang internal relied on and every patch applied
(``registry``)."""
