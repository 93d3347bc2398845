"""sglang.benchmark.serving with skip_special_tokens=False in every request's sampling params
(dummy weights + simulated acceptance emit ids that detokenize to empty text; bench_serving
stamps the first token at the first non-empty text)."""
import dataclasses
import sys

import sglang.benchmark.serving as serving

for name, func in list(serving.ASYNC_REQUEST_FUNCS.items()):
    if name != "sglang":
        continue

    def wrap(func):
        async def request(request_func_input, pbar=None):
            args = serving.args
            extra = {**request_func_input.extra_request_body, "sampling_params": {
                "temperature": args.temperature, "max_new_tokens": request_func_input.output_len,
                "ignore_eos": not args.disable_ignore_eos, "skip_special_tokens": False}}
            return await func(dataclasses.replace(request_func_input, extra_request_body=extra), pbar)
        return request

    serving.ASYNC_REQUEST_FUNCS[name] = wrap(func)

if __name__ == "__main__":
    serving.cli_main()
