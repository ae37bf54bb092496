"""Every HTTP route each engine declares (its OpenAPI document, as exported from the released
package), and how the stand-in matches a request's path against them.

A route the engine declares but the stand-in does not serve is answered 501 in the engine's error
shape (a client learns the route exists and that this engine does not do it here), a declared
route asked with another method 405, and anything else 404 ``{"detail": "Not Found"}``, as the
engines' FastAPI apps answer. Paths with ``{name}`` segments match one segment each, except
SGLang's ``/v1/models/{model}``, declared ``{model:path}`` (a model name may hold slashes).
"""

from __future__ import annotations

import re
from typing import Dict, List, Optional, Tuple

# path -> the methods it is declared for, read off vllm-0.33.0-openapi.json and sglang-0.5.23-openapi.json
OPENAPI: Dict[str, Dict[str, str]] = {
    "vllm": {
        "/detokenize": "POST",
        "/generative_scoring": "POST",
        "/health": "GET",
        "/invocations": "POST",
        "/is_scaling_elastic_ep": "POST",
        "/kv_event_sources": "GET",
        "/load": "GET",
        "/metrics": "GET",
        "/ping": "GET POST",
        "/scale_elastic_ep": "POST",
        "/tokenize": "POST",
        "/v1/chat/completions": "POST",
        "/v1/chat/completions/batch": "POST",
        "/v1/completions": "POST",
        "/v1/decisions": "POST",
        "/v1/messages": "POST",
        "/v1/messages/count_tokens": "POST",
        "/v1/models": "GET",
        "/v1/responses": "POST",
        "/v1/responses/{response_id}": "GET",
        "/v1/responses/{response_id}/cancel": "POST",
        "/v1/systemone": "POST",
        "/version": "GET",
    },
    "sglang": {
        "/": "GET HEAD",
        "/abort_request": "POST",
        "/add_external_corpus": "POST",
        "/api/chat": "POST",
        "/api/generate": "POST",
        "/api/show": "POST",
        "/api/tags": "GET",
        "/begin_weight_update": "POST",
        "/classify": "POST PUT",
        "/close_session": "GET POST",
        "/configure_logging": "GET POST",
        "/continue_generation": "POST",
        "/destroy_weights_update_group": "POST",
        "/dump_expert_distribution_record": "GET POST",
        "/encode": "POST PUT",
        "/end_weight_update": "POST",
        "/flush_cache": "GET POST",
        "/freeze_gc": "GET POST",
        "/generate": "POST PUT",
        "/get_hicache_l3_cache_layout": "GET",
        "/get_model_info": "GET",
        "/get_remote_instance_transfer_engine_info": "GET",
        "/get_server_info": "GET",
        "/get_weights_by_name": "GET POST",
        "/health": "GET",
        "/health_generate": "GET",
        "/hicache/storage-backend": "DELETE GET PUT",
        "/hicache/storage-backend/clear": "POST",
        "/init_weights_send_group_for_remote_instance": "POST",
        "/init_weights_update_group": "POST",
        "/invocations": "POST",
        "/is_scaling_elastic_ep": "GET",
        "/list_external_corpora": "GET",
        "/load_lora_adapter": "POST",
        "/load_lora_adapter_from_tensors": "POST",
        "/model_info": "GET",
        "/open_session": "GET POST",
        "/parse_function_call": "POST",
        "/pause_generation": "POST",
        "/pd_role_switch": "POST",
        "/ping": "GET",
        "/ready": "GET",
        "/release_memory_occupation": "GET POST",
        "/remote_instance_transfer_engine_info": "GET",
        "/remove_external_corpus": "POST",
        "/resume_memory_occupation": "GET POST",
        "/scale_elastic_ep": "POST",
        "/send_weights_to_remote_instance": "POST",
        "/separate_reasoning": "POST",
        "/server_info": "GET",
        "/set_internal_state": "POST PUT",
        "/set_trace_level": "GET POST",
        "/slow_down": "GET POST",
        "/start_expert_distribution_record": "GET POST",
        "/start_profile": "GET POST",
        "/stop_expert_distribution_record": "GET POST",
        "/stop_profile": "GET POST",
        "/unload_lora_adapter": "POST",
        "/update_weight_version": "POST",
        "/update_weights_from_disk": "POST",
        "/update_weights_from_distributed": "POST",
        "/update_weights_from_ipc": "POST",
        "/update_weights_from_tensor": "POST",
        "/v1/audio/transcriptions": "POST",
        "/v1/chat/completions": "POST",
        "/v1/classify": "POST",
        "/v1/completions": "POST",
        "/v1/decisions": "POST",
        "/v1/detokenize": "POST",
        "/v1/embeddings": "POST",
        "/v1/loads": "GET",
        "/v1/messages": "POST",
        "/v1/messages/count_tokens": "POST",
        "/v1/models": "GET",
        "/v1/models/{model}": "GET",
        "/v1/rerank": "POST PUT",
        "/v1/responses": "POST",
        "/v1/responses/{response_id}": "GET",
        "/v1/responses/{response_id}/cancel": "POST",
        "/v1/score": "POST",
        "/v1/systemone": "POST",
        "/v1/tokenize": "POST",
        "/vertex_generate": "POST",
        "/weights_checker": "GET POST",
    },
}
# Mounted beside the app, so outside its OpenAPI: SGLang's Prometheus exporter.
MOUNTED = {"vllm": {}, "sglang": {"/metrics": "GET"}}
PATH_SEGMENTS = {"/v1/models/{model}": r"(?P<model>.+)"}


def _pattern(template: str) -> "re.Pattern[str]":
    special = PATH_SEGMENTS.get(template)
    parts = re.split(r"(\{[a-z_]+\})", template)
    regex = "".join(special if special and p.startswith("{") else
                    (f"(?P<{p[1:-1]}>[^/]+)" if p.startswith("{") else re.escape(p)) for p in parts)
    return re.compile(regex + "$")


_TEMPLATES = {engine: [(t, _pattern(t)) for t in sorted(paths) if "{" in t] for engine, paths in OPENAPI.items()}


def declared(engine: str) -> Dict[str, List[str]]:
    """Every route of the engine with its methods (the OpenAPI's and the mounted ones)."""
    table = {**OPENAPI.get(engine, {}), **MOUNTED.get(engine, {})}
    return {path: methods.split() for path, methods in table.items()}


def match(engine: str, path: str) -> Optional[Tuple[str, Dict[str, str]]]:
    """The declared route ``path`` is (its template and the values of its ``{}`` segments), or None."""
    table = declared(engine)
    if path in table:
        return path, {}
    for template, pattern in _TEMPLATES.get(engine, []):
        found = pattern.match(path)
        if found:
            return template, found.groupdict()
    return None
