"""`whisper-server serve|transcribe`: flags map 1:1 onto Settings fields (env `WHISPER_*` works for each).

Flags are parsed and checked (the model, the audio files) before torch or a model loads: --help, --version and a
mistyped argument answer at once, a mistake is one line on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import logging
import logging.config
import os
import sys
import typing
from collections.abc import Iterable, Sequence
from pathlib import Path

from pydantic import ValidationError

from .response_format import ResponseFormat
from .settings import Settings

PROG = "whisper-server"
USAGE_ERROR = 2  # argparse's status for a bad command line

# Settings that matter to `transcribe` (no HTTP server there).
ENGINE_FIELDS = (
    "model",
    "tokenizer",
    "device",
    "dtype",
    "max_num_seqs",
    "max_encoder_batch",
    "num_threads",
    "enforce_eager",
    "dummy_weights",
    "seed",
    "log_level",
)


def add_settings_arguments(parser: argparse.ArgumentParser, names: Iterable[str]) -> None:
    """One `--kebab-case` flag per Settings field; unset flags fall through to env vars, then defaults."""
    for name in names:
        field = Settings.model_fields[name]
        env = f"{Settings.model_config['env_prefix']}{name.upper()}"
        default = field.get_default(call_default_factory=True)
        help_text = f"{field.description} (env {env}; default {default!r})"
        flag = "--" + name.replace("_", "-")
        if field.annotation is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS, help=help_text)
            continue
        if typing.get_origin(field.annotation) is list or name == "model":  # repeatable: --api-key a --api-key b
            parser.add_argument(flag, dest=name, action="append", default=argparse.SUPPRESS, help=help_text)
            continue
        choices = typing.get_args(field.annotation) if typing.get_origin(field.annotation) is typing.Literal else None
        parser.add_argument(
            flag,
            dest=name,
            default=argparse.SUPPRESS,
            choices=choices,
            help=help_text,
            metavar=None if choices else name.upper(),
        )


def _version() -> str:
    # A checkout run with its root on sys.path (no `pip install`) has no package metadata
    try:
        return importlib.metadata.version(PROG)
    except importlib.metadata.PackageNotFoundError:
        return "(not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description="OpenAI-compatible Whisper speech-to-text.")
    parser.add_argument("--version", action="version", version=f"{PROG} {_version()}")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the HTTP server")
    add_settings_arguments(serve, Settings.model_fields)
    transcribe = commands.add_parser("transcribe", help="transcribe audio files and print the result")
    transcribe.add_argument("audio", nargs="+", type=Path, help="audio files (any format ffmpeg decodes)")
    transcribe.add_argument("--language", help="ISO-639-1 code of the audio's language (default: detect)")
    transcribe.add_argument("--task", choices=["transcribe", "translate"], default="transcribe")
    transcribe.add_argument("--output-format", choices=[f.value for f in ResponseFormat], default="text")
    transcribe.add_argument("--prompt", help="text that precedes the audio (style, spellings)")
    transcribe.add_argument("--temperature", type=float, default=0.0, help="0 = fallback schedule 0.0..1.0")
    add_settings_arguments(transcribe, ENGINE_FIELDS)
    return parser


def settings_from_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Settings:
    given = {name: value for name, value in vars(args).items() if name in Settings.model_fields}
    if "model" in given:  # --model given several times: the first is the default, the others extra models
        first, *more = given["model"]
        given["model"] = first
        if more:
            given["extra_model"] = [*more, *given.get("extra_model", [])]
    try:
        return Settings(**given)
    except ValidationError as exc:
        first = exc.errors()[0]
        parser.error(f"--{'-'.join(str(p) for p in first['loc']).replace('_', '-')}: {first['msg']}")


def serve(settings: Settings) -> int:
    from .serving import run_server

    if settings.api_servers == 1:
        return run_server(settings)
    from .frontends import FrontEndPlan, use_multiprocess_metrics

    plan = FrontEndPlan.create(settings.api_servers)
    use_multiprocess_metrics(plan)
    try:
        return run_server(settings, plan)
    finally:
        plan.remove()  # when it fails to start (a stop by signal does not come back here: FrontEnds.stop)


def unreadable_audio(paths: Iterable[Path]) -> str | None:
    """Why the first of `paths` cannot be read, or None: checked before the engine loads."""
    for path in paths:
        if not path.exists():
            return f"{path}: no such file"
        if not path.is_file():
            return f"{path}: not a file"
        if not os.access(path, os.R_OK):
            return f"{path}: not readable"
    return None


def transcribe(parser: argparse.ArgumentParser, args: argparse.Namespace, settings: Settings) -> int:
    from engine import AudioDecodeError, Engine, InvalidRequestError, Task, decode_audio

    from .errors import APIError
    from .formatting import render
    from .parsing.fields import parse_language
    from .parsing.options import decode_options

    task = Task(args.task)
    try:
        language = parse_language(args.language)
    except APIError as exc:
        parser.error(exc.message)
    options = decode_options(task, language, args.prompt, args.temperature, settings=settings)
    response_format = ResponseFormat(args.output_format)
    engine = Engine(settings.engine_config())
    engine.start()
    status = 0
    try:
        for path in args.audio:
            try:
                audio = decode_audio(path.read_bytes())
            except (OSError, AudioDecodeError) as exc:
                print(f"{path}: cannot read audio: {exc}", file=sys.stderr)
                status = 1
                continue
            try:
                result = engine.transcribe(audio, options)
            except InvalidRequestError as exc:  # e.g. --task translate on an English-only model
                print(f"{PROG} transcribe: {exc}", file=sys.stderr)
                return USAGE_ERROR
            body = render(result, response_format, task)
            if len(args.audio) > 1:
                print(f"==> {path} <==")
            sys.stdout.write(body.content if body.content.endswith("\n") else body.content + "\n")
            sys.stdout.flush()
    finally:
        engine.shutdown()
    return status


def usage_error(command: str, message: str) -> int:
    print(f"{PROG} {command}: error: {message}", file=sys.stderr)
    return USAGE_ERROR


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "transcribe":
        if not 0.0 <= args.temperature <= 1.0:
            parser.error("--temperature must be between 0 and 1")
        if problem := unreadable_audio(args.audio):
            return usage_error(args.command, problem)
    settings = settings_from_args(parser, args)
    from engine import ModelNotFoundError, check_model, resolve_adapter

    try:
        for spec in settings.served_models():
            check_model(spec.source, settings.dummy_weights)
            for _, source in spec.config.loras:  # a hub adapter is fetched here, where its engine then finds it
                resolve_adapter(source)
    except (ModelNotFoundError, ValueError) as exc:
        return usage_error(args.command, str(exc))
    if args.command == "serve":
        from .logs import log_config

        logging.config.dictConfig(log_config(settings.log_level, settings.log_format))
        return serve(settings)
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return transcribe(parser, args, settings)
