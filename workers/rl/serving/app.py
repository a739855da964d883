"""An OpenAI-compatible server of one model on the studio's own engines: `/v1/models`, `/v1/chat/completions`
(streamed as server-sent events when asked), `/v1/completions`, with logprobs. `manage.py serve` builds the model
(a run's checkpoint, an alias, or a base model) and runs this app under uvicorn; the studio's evaluations and its
judge layer can point at it like at any other endpoint.

Every request goes to the engine's batching loop, so concurrent clients share forward passes (continuous
batching, as in training). The app is its routes, one module each, over the model they share (served_model.py):
chat_completions.py, completions.py, weights.py, and tokenizer.py (vLLM's /tokenize, /detokenize and
/tokenizer_info, which lm-evaluation-harness's remote tokenizer reads); answers.py writes an engine's completion in
the API's shapes (stop strings, logprobs), parameters.py says which parameters are refused rather than ignored
(the README's "OpenAI API support" table lists what each gets).

For RL generation on inference servers (engines/server.py) the server also:
- answers every completion with the `policy_version` of the weights that sampled it (a top-level field), and,
  asked with `"return_token_ids": true` (vLLM's name), the ids themselves: `prompt_token_ids` at the top level
  and each choice's `token_ids` (the stop id included when the model stopped), beside the usual `logprobs`
  (of the distribution sampled from, temperature applied). `/v1/completions` takes a prompt of token ids and
  `stop_token_ids` (vLLM's name; default: the chat format's stop ids).
- loads new weights on `POST /v1/weights` `{"location": URL or directory, "policy_version": N}`: a published
  weights directory (workers/storage; its `model.safetensors` holds the trainer's names), read from the object
  store or disk before anything pauses, then swapped in atomically between requests: new requests wait while
  the ones in flight finish on the old weights, then run on the new. `GET /v1/weights` says the version served.
  It is protected by a bearer token (`weights_token`; `serve` reads STUDIO_SERVE_WEIGHTS_TOKEN); with no token
  set, only clients on the loopback interface may load weights. vLLM's server gets the same route from
  vllm_server.py; what the two share is weight_sync.py.
"""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from .chat_completions import chat_completions
from .completions import completions
from .served_model import ServedModel
from .tokenizer import detokenize, tokenize, tokenizer_info
from .weights import weights


def build_app(*, engine, chat, model_name: str, weights_token: str = "", api_token: str = "",
              policy_version: int | None = None) -> Starlette:
    """The app serving `engine` (a BatchingEngine) with `chat` (its model's chat format) as `model_name`.
    `weights_token`: the bearer token `POST /v1/weights` needs (empty: loopback clients only). `api_token`: the
    bearer token every other route needs too (vLLM's `--api-key`; empty: none)."""
    served = ServedModel(engine=engine, chat=chat, model_name=model_name, api_token=api_token,
                         policy_version=policy_version)
    return Starlette(routes=[Route("/v1/models", models(served)),
                             Route("/v1/chat/completions", chat_completions(served), methods=["POST"]),
                             Route("/v1/completions", completions(served), methods=["POST"]),
                             Route("/v1/weights", weights(served, token=weights_token), methods=["GET", "POST"]),
                             # vLLM's tokenizer routes, at the root as vLLM has them (lm-evaluation-harness's remote
                             # tokenizer): tokenizer.py
                             Route("/tokenize", tokenize(served), methods=["POST"]),
                             Route("/detokenize", detokenize(served), methods=["POST"]),
                             Route("/tokenizer_info", tokenizer_info(served))])


def models(served: ServedModel):
    """`GET /v1/models`: the one model served."""

    async def endpoint(request: Request):
        if refused := served.refused(request):
            return refused
        return JSONResponse({"object": "list", "data": [{"id": served.model_name, "object": "model",
                                                         "created": served.created, "owned_by": "posttrain-studio"}]})

    return endpoint
