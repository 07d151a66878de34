"""Server settings: one pydantic-settings object, read from ``DIRECTOR_*`` environment variables.

``python -m service`` builds its command line from these fields (see ``service.cli``); a flag given on
the command line overrides the environment.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict


class Settings(BaseSettings):
    """Every option of the server. List values are comma-separated in the environment."""

    model_config = SettingsConfigDict(env_prefix="DIRECTOR_", extra="ignore", protected_namespaces=())

    host: str = Field("127.0.0.1", description="address to bind (0.0.0.0 inside a container)")
    port: int = Field(8000, ge=0, le=65535, description="TCP port")
    grpc_port: int = Field(0, ge=0, le=65535, description="TCP port of the gRPC Open Inference Protocol (KServe's "
                           "inference.GRPCInferenceService, as Triton serves it); 0: off")
    grpc_max_concurrent_calls: int = Field(16, ge=1, le=1024, description="gRPC calls served at once; more get "
                                           "RESOURCE_EXHAUSTED before their messages are read (each may hold up "
                                           "to max_body_bytes of message)")
    grpc_max_bytes_in_flight: int | None = Field(None, ge=1024, description="bytes of gRPC request messages held at "
                                                 "once, from each one's arrival to the end of its call: one that "
                                                 "would pass it is refused with RESOURCE_EXHAUSTED before it is "
                                                 "parsed (unset: 4 x max_body_bytes; at least max_body_bytes, so the "
                                                 "largest message is served alone)")
    workers: int = Field(1, ge=1, description="uvicorn worker processes (each loads every model)")
    model_repository: Path = Field(Path("model_repository"), description="folder of <model>/<version>/ artifacts")
    default_model: str = Field("fashion-vit", description="model used when a request names none")
    required_models: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="comma-separated models that must be ready before /health/ready is 200")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto = cuda when available, else cpu")
    torch_threads: int = Field(0, ge=0, description="torch intra-op threads (0 = torch's default)")
    concurrent_forwards: int = Field(0, ge=0, description="forwards of different models that may run at once on "
                                     "the device; a seeded batch always runs alone (0 = by device: on a CPU its "
                                     "cores over torch_threads, at least 1; on CUDA 1)")
    bf16: bool = Field(False, description="bf16 autocast for inference on CUDA (ignored on CPU)")
    max_batch_samples: int | None = Field(None, ge=1, description="rows per forward: sum over inputs of n_samples "
                                          "(unset: 128 on CPU, measured best on a 2-core CPU in docs/benchmarks.md; "
                                          "1024 on CUDA; docs/operations.md, per-device defaults)")
    max_batch_tokens: int | None = Field(None, ge=1, description="text models: padded tokens x samples per forward "
                                         "(the batch's longest text rounded up to a multiple of 8, times its sampled "
                                         "rows; unset: 2048 on CPU, e.g. 4 requests of 16 samples at 32 padded "
                                         "tokens, the largest forward before the MiniLM artifact's inputs/s fall on a "
                                         "2-core CPU, docs/benchmarks-text.md; 16384 on CUDA)")
    shape_buckets: bool | None = Field(None, description="pad each forward's input and row counts to powers of two "
                                       "up to the budget and warm every such shape before a model is ready (unset: "
                                       "on for CUDA, off for CPU, where padding only adds work)")
    max_batch_delay_ms: float = Field(0.0, ge=0, description="how long a batch waits for more requests (0: it takes "
                                      "what queued during the previous forward; measured best in docs/benchmarks.md)")
    max_queue: int = Field(256, ge=1, description="queued requests per model version before 503")
    request_timeout_s: float = Field(30.0, gt=0, description="queue + inference time before 504")
    body_timeout_s: float = Field(10.0, gt=0, description="seconds a request body may take to arrive in full, from "
                                  "the end of its headers (408 and the connection closed after)")
    max_header_bytes: int = Field(32_768, ge=1024, description="request line and headers of one request, in bytes "
                                  "(431 and the connection closed above: bounds what a connection buffers before "
                                  "its request is even parsed)")
    max_headers: int = Field(100, ge=8, description="header fields of one request (431 above)")
    header_timeout_s: float = Field(10.0, gt=0, description="seconds a connection may take to send a request's "
                                    "headers, from its opening or its request's first byte (408 and closed after)")
    max_connections: int = Field(1024, ge=1, description="open connections (or requests in progress) beyond which a "
                                 "new request is answered 503 by uvicorn")
    max_body_bytes: int = Field(16 * 1024 * 1024, ge=1024, description="largest request body (413 above)")
    max_image_pixels: int = Field(4_000_000, ge=1, description="largest width x height of an image (413 above)")
    max_inputs_per_request: int = Field(256, ge=1, description="inputs per request (413 above)")
    max_request_batches: int = Field(16, ge=1, description="what one request may cost, in full batches "
                                     "(max_batch_samples rows for images, max_batch_tokens padded tokens x samples "
                                     "for texts): 413 above, before it is queued, so that one request cannot hold "
                                     "a model's forwards for long")
    max_request_pixels: int = Field(16_000_000, ge=1, description="decoded image pixels per request: width x height "
                                    "summed over its encoded images (413 above; bounds one request's decoding time)")
    decode_threads: int = Field(2, ge=1, description="threads that decode images, convert pixels and tokenize texts "
                                "off the event loop")
    max_text_chars: int = Field(5000, ge=1, description="longest text input in characters (413 above; a text "
                                "model's own input.max_characters applies when lower)")
    api_key: SecretStr | None = Field(None, description="if set, every route but health and metrics needs "
                                                        "'Authorization: Bearer <key>' (empty = no key); environment "
                                                        "only, never a flag: a flag shows on the process list")
    api_key_file: Path | None = Field(None, description="read the API key from this file instead (e.g. a mounted "
                                      "secret; surrounding whitespace stripped; an empty file is an error)")
    feedback_keys: Annotated[dict[str, SecretStr], NoDecode] = Field(
        default_factory=dict, description="named keys of their own for POST /feedback, as JSON {name: key}: when set, "
        "/feedback takes only these (not the API key) and each label is attributed to its key's name; environment "
        "only")
    feedback_min_clients: int | None = Field(None, ge=1, le=100, description="feedback clients a live coverage or "
                                             "risk window needs before its alert may fire (exported as "
                                             "director_feedback_min_clients); default: 1 with feedback keys (each "
                                             "named labeller trusted), else 2 (no one client can fire an alert)")
    feedback_keys_file: Path | None = Field(None, description="read the feedback keys from this file instead: one "
                                            "'name:key' per line (a mounted secret)")
    public_docs: bool = Field(False, description="serve /docs, /redoc and /openapi.json without the API key (when a "
                              "key is set they need it unless this is on)")
    metrics_require_key: bool = Field(False, description="/metrics needs the API key too (when one is set); off by "
                                      "default because a Prometheus scrape sends no credentials unless its job is "
                                      "given them (authorization.credentials_file); see docs/operations.md")
    metrics_max_age_s: float = Field(1.0, ge=0, le=60, description="a /metrics body is made at most once per this "
                                     "many seconds (in a thread, one at a time) and served to every scrape meanwhile, "
                                     "so a flood of scrapes cannot hold the server; 0: a body per scrape")
    health_details: bool = Field(True, description="/health/ready lists every model, version and state; off: the "
                                 "status alone (probes read only the status code), for a port untrusted clients "
                                 "reach")
    trusted_digests: Path | None = Field(None, description="file of allowed sha256 digests of director.ts files, one "
                                         "per line (sha256sum format), kept outside the repository: any other "
                                         "artifact is refused before it is loaded and reported in /models")
    poll_interval_s: float = Field(5.0, ge=0, description="model repository polling period (0 = off)")
    shutdown_grace_s: float = Field(0.0, ge=0, description="on SIGTERM, report not-ready this long before "
                                                           "closing the listener")
    feedback_db: Path = Field(Path("var/feedback.sqlite3"), description="SQLite file of logged predictions (when "
                              "no feedback_url is set)")
    feedback_url: SecretStr | None = Field(None, description="postgresql://user@host:port/db: a PostgreSQL feedback "
                                           "store shared by every replica instead of the SQLite file (empty = none; "
                                           "environment only; the password is best given as PGPASSWORD)")
    feedback_max_rows: int = Field(100_000, ge=1, description="logged predictions kept (oldest dropped)")
    feedback_max_age_s: float = Field(7 * 24 * 3600.0, gt=0, description="logged predictions older than this "
                                                                         "are dropped")
    feedback_window: int = Field(1000, ge=1, description="latest labelled predictions behind live accuracy/ECE")
    feedback_timeout_s: float = Field(2.0, gt=0, description="longest a feedback store call may take before "
                                      "/feedback answers 503 (a locked or unreachable store)")
    live_refresh_s: float = Field(5.0, gt=0, description="how often the live gauges (accuracy, ECE, coverage, "
                                  "selective risk) are read from the feedback store, off the request path: a "
                                  "/metrics scrape only reads the gauges, and this read also finds a store that "
                                  "recovered")
    feedback_threads: int = Field(2, ge=1, description="threads of the feedback store's own pool (never shared "
                                  "with inference or decoding)")
    feedback_retry_s: float = Field(1.0, gt=0, description="after a feedback store call fails, how long its calls "
                                    "are refused at once (503) before one tries the store again")
    cors_origins: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="comma-separated browser origins allowed to call the API across origins "
        "(CORS; e.g. https://app.example.com, or * for any); empty = CORS off")
    drift_window: int = Field(1000, ge=10, description="live confidences kept for the drift monitor")
    drift_min_window: int = Field(200, ge=10, description="confidences needed before drift is reported")
    log_level: Literal["critical", "error", "warning", "info", "debug"] = Field("info", description="log level")
    log_format: Literal["text", "json"] = Field("text", description="log lines as text, or one JSON object each")
    otlp_endpoint: str | None = Field(None, description="OpenTelemetry: an OTLP/HTTP collector's base URL (e.g. "
                                      "http://otel-collector:4318) to export spans of every HTTP request, its queue "
                                      "wait and its batch's forward to; unset: no tracing")
    access_log: bool = Field(False, description="one log line per HTTP request (method, route, status, duration, "
                             "request id, trace id)")

    @field_validator("required_models", "cors_origins", mode="before")
    @classmethod
    def _split_names(cls, value: object) -> object:
        if isinstance(value, str):
            return [name.strip() for name in value.split(",") if name.strip()]
        return value

    @field_validator("feedback_keys", mode="before")
    @classmethod
    def _named_keys_from_json(cls, value: object) -> object:
        """``DIRECTOR_FEEDBACK_KEYS``: a JSON object of name -> key; empty (compose passing an unset variable) is
        none."""
        if isinstance(value, str):
            if not value.strip():
                return {}
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise ValueError('feedback keys must be a JSON object such as {"labeller": "<key>"}') from exc
        return value

    @field_validator("api_key", "feedback_url", mode="before")
    @classmethod
    def _empty_key_is_no_key(cls, value: object) -> object:
        """``DIRECTOR_API_KEY=`` (how compose passes a variable left empty in .env) means no key, not a key that
        no bearer token can match. Blank is empty too: a bearer token is compared stripped, so it never matches. An
        empty ``DIRECTOR_FEEDBACK_URL=`` likewise means the SQLite file."""
        if isinstance(value, SecretStr):
            value = value.get_secret_value()
        if isinstance(value, str) and not value.strip():
            return None
        return value

    @field_validator("feedback_url")
    @classmethod
    def _postgres_url(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and not value.get_secret_value().startswith(("postgresql://", "postgres://")):
            raise ValueError("the feedback URL must start with postgresql:// (or postgres://)")
        return value

    @model_validator(mode="after")
    def _feedback_keys_from_file(self) -> Settings:
        """Named feedback keys: from the file when one is named (an unreadable, empty or malformed file stops the
        server, as the API key file does); a name or key that is blank, or a key given twice, is an error."""
        if self.feedback_keys_file is not None:
            if self.feedback_keys:
                raise ValueError("set DIRECTOR_FEEDBACK_KEYS or DIRECTOR_FEEDBACK_KEYS_FILE, not both")
            self.feedback_keys = read_named_keys(self.feedback_keys_file)
        secrets = [key.get_secret_value().strip() for key in self.feedback_keys.values()]
        if any(not name.strip() for name in self.feedback_keys) or not all(secrets):
            raise ValueError("every feedback key needs a name and a non-empty key")
        if len(set(secrets)) != len(secrets):
            raise ValueError("two feedback keys are the same key: a label could not be attributed to one name")
        return self

    @property
    def alert_min_clients(self) -> int:
        """``feedback_min_clients``, or its default."""
        if self.feedback_min_clients is not None:
            return self.feedback_min_clients
        return 1 if self.feedback_keys else 2

    @property
    def grpc_bytes_in_flight_limit(self) -> int:
        """``grpc_max_bytes_in_flight``, or its default: four messages of the largest size."""
        return self.grpc_max_bytes_in_flight or 4 * self.max_body_bytes

    @model_validator(mode="after")
    def _message_fits_in_flight(self) -> Settings:
        """A bound below the largest message would refuse every such message, even to an idle server."""
        if self.grpc_max_bytes_in_flight is not None and self.grpc_max_bytes_in_flight < self.max_body_bytes:
            raise ValueError(f"grpc_max_bytes_in_flight ({self.grpc_max_bytes_in_flight}) is below max_body_bytes "
                             f"({self.max_body_bytes}): the largest message allowed could never be served")
        return self

    @model_validator(mode="after")
    def _key_from_file(self) -> Settings:
        """The key from ``api_key_file``. Unlike an empty variable, an empty or unreadable file stops the server: a
        file was named, so a key was meant, and serving without one would open every route."""
        if self.api_key_file is None:
            return self
        if self.api_key is not None:
            raise ValueError("set DIRECTOR_API_KEY or DIRECTOR_API_KEY_FILE, not both")
        try:
            key = self.api_key_file.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"cannot read the API key file {self.api_key_file}: {exc}") from exc
        if not key:
            raise ValueError(f"the API key file {self.api_key_file} is empty")
        self.api_key = SecretStr(key)
        return self


def read_named_keys(path: Path) -> dict[str, SecretStr]:
    """``name:key`` lines (blank lines and ``#`` comments skipped)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read the feedback keys file {path}: {exc}") from exc
    keys: dict[str, SecretStr] = {}
    for number, line in enumerate(lines, 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, colon, key = line.partition(":")
        if not colon or name.strip() in keys:
            raise ValueError(f"{path} line {number}: expected 'name:key' with a name not used before")
        keys[name.strip()] = SecretStr(key.strip())
    if not keys:
        raise ValueError(f"the feedback keys file {path} names no key")
    return keys
