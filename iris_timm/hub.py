"""Save, publish and load iris models as Hugging Face Hub folders that timm and transformers read.

A saved model is a folder of three files:

- ``model.safetensors``: the weights, never a pickle;
- ``config.json``: timm's hub config (``architecture``, ``num_classes``, ``num_features``, ``global_pool``,
  ``model_args``, ``label_names``, ``pretrained_cfg``), which ``timm.create_model("local-dir:PATH")``,
  ``timm.create_model("hf-hub:ORG/NAME")`` and transformers' ``TimmWrapperForImageClassification`` read;
- ``README.md``: the model card (``iris_timm.model_card``).

Writing is timm's ``save_for_hf`` (staged, then moved into place); publishing is ``HfApi.create_repo`` and
``HfApi.upload_folder``; loading is timm's ``create_model``, once the files have been checked so that bad files raise
a clear error before any weights are read. The weights are checked by ``iris_timm.weights.check_weights``: their
names, shapes and dtypes from the file's header before loading, their values as an iris model's
``checkpoint_filter_fn`` receives them (another timm model's once loaded).
"""

import difflib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import timm
from huggingface_hub import CommitInfo, HfApi, snapshot_download
from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError
from huggingface_hub.utils import validate_repo_id
from timm.models import save_for_hf
from torch import nn

from .files import apply_umask
from .models import IrisPDESSM
from .version import __version__
from .weights import check_weights, check_weights_file

if TYPE_CHECKING:
    from .model_card import TrainingResults

__all__ = [
    "CARD_NAME",
    "CONFIG_NAME",
    "VERSION_KEY",
    "WEIGHTS_NAME",
    "from_pretrained",
    "push_to_hub",
    "save_pretrained",
]

# The file names timm's local-dir: and hf-hub: loaders read.
WEIGHTS_NAME = "model.safetensors"
CONFIG_NAME = "config.json"
CARD_NAME = "README.md"
# The config.json key naming the iris_timm version that saved the folder; a folder without it was written by 0.1.
VERSION_KEY = "iris_timm_version"
# The oldest iris_timm whose folders this version reads, and why older ones are not read.
OLDEST_READABLE_VERSION = (0, 3)
OLDEST_READABLE_REASON = "0.3 changed the block: the operator's output is added without a norm"
# The keys of timm's hub config that loading needs.
REQUIRED_CONFIG_KEYS = ("architecture", "num_classes", "pretrained_cfg")
# Staging folders of saves in progress: ".save_pretrained-<pid>-<random>".
STAGING_PREFIX = ".save_pretrained-"
# Weights in other formats that timm's and transformers' loaders read; a new save removes them.
STALE_WEIGHT_NAMES = ("pytorch_model.bin", "open_clip_pytorch_model.bin", "open_clip_model.safetensors")
# torch.save / pickle checkpoints, which are never loaded.
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".tar")

_CONVERT_PICKLE = (
    "iris_timm reads weights only from safetensors and never unpickles (loading a pickle can run arbitrary code). "
    "Convert them once, if you trust the file: load them into the model with "
    "model.load_state_dict(torch.load(path, weights_only=True)), then write the folder with "
    "iris_timm.save_pretrained(model, folder)."
)


def _check_saveable(model: nn.Module, label_names: Sequence[str] | None) -> None:
    wrapped = hasattr(model, "_orig_mod") or isinstance(model, (nn.DataParallel, nn.parallel.DistributedDataParallel))
    if wrapped:
        raise TypeError(
            f"Expected a timm model, got {type(model).__name__}. Unwrap compiled or distributed models first "
            "(model._orig_mod, accelerator.unwrap_model(model))."
        )
    if not hasattr(model, "pretrained_cfg"):
        raise ValueError(
            "The model has no pretrained_cfg, so its architecture and arguments cannot be saved: create it with "
            "timm.create_model (e.g. timm.create_model('iris_pdessm_s', num_classes=10)) or iris_timm.from_pretrained."
        )
    if label_names is not None and len(label_names) != model.num_classes:
        raise ValueError(
            f"label_names has {len(label_names)} names for a model with {model.num_classes} classes: give one name "
            "per class, in classifier order."
        )


def _finish_config(config_path: Path) -> None:
    """Record the iris_timm version that wrote the folder (:func:`_check_version` reads it), and remove
    ``num_classes`` from ``model_args``: the top-level ``num_classes`` already restores it for timm, and
    transformers' TimmWrapper passes ``num_classes`` next to ``**model_args``, which fails when both hold it."""
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config.get("model_args", {}).pop("num_classes", None)
    config[VERSION_KEY] = __version__
    config_path.write_text(json.dumps(config, indent=2), encoding="utf-8")


def _check_version(path: Path, config: dict[str, Any]) -> None:
    """An iris model's folder was written by a version whose architecture this one builds (see
    ``OLDEST_READABLE_VERSION``); a folder without ``VERSION_KEY`` counts as written by 0.1."""
    if not config["architecture"].startswith("iris_"):
        return
    written_by = str(config.get(VERSION_KEY, "0.1"))
    try:
        major_minor = tuple(int(part) for part in written_by.split(".")[:2])
    except ValueError:
        raise ValueError(f"{path}: {VERSION_KEY} is {written_by!r}, not a version number.") from None
    if major_minor < OLDEST_READABLE_VERSION:
        raise ValueError(
            f"{path} was written by iris_timm {written_by}; this is iris_timm {__version__}, which reads folders "
            f"written by {'.'.join(map(str, OLDEST_READABLE_VERSION))} or later ({OLDEST_READABLE_REASON}). "
            f"Use iris_timm {written_by} for it, or retrain."
        )


def _commit(staging: Path, directory: Path) -> None:
    """Move the files staged in ``staging`` into ``directory``, ``config.json`` last (see ``save_pretrained``)."""
    staged = sorted(staging.iterdir(), key=lambda path: path.name == CONFIG_NAME)
    for path in staged:
        apply_umask(path)  # safetensors writes its files readable by the owner only
        with path.open("r+b") as f:
            os.fsync(f.fileno())  # the data is on disk before any rename makes it visible
    (directory / CONFIG_NAME).unlink(missing_ok=True)
    for path in staged:
        os.replace(path, directory / path.name)


def _remove_stale_staging(directory: Path) -> None:
    """Remove the staging folders of saves whose process is gone (killed mid-save), never a live one's."""
    for path in directory.glob(f"{STAGING_PREFIX}*"):
        pid = path.name[len(STAGING_PREFIX) :].split("-")[0]
        if not (pid.isdigit() and _process_is_alive(int(pid))):
            shutil.rmtree(path, ignore_errors=True)


def _process_is_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


@contextmanager
def _staging(directory: Path) -> Iterator[Path]:
    """A staging folder inside ``directory`` (named by this process's PID, so a later save can tell a dead save's
    leftovers from a live one's); on success its files are committed into ``directory`` and the weight files of
    other formats, which loaders could prefer to the new ones, are removed."""
    directory.mkdir(parents=True, exist_ok=True)
    _remove_stale_staging(directory)
    with tempfile.TemporaryDirectory(dir=directory, prefix=f"{STAGING_PREFIX}{os.getpid()}-") as tmp:
        yield Path(tmp)
        _commit(Path(tmp), directory)
    for name in STALE_WEIGHT_NAMES:
        (directory / name).unlink(missing_ok=True)


def _write_timm_files(model: nn.Module, staging: Path, label_names: Sequence[str] | None) -> None:
    """timm's ``model.safetensors`` and ``config.json``, the config readable by timm and transformers alike."""
    model_config = {"label_names": list(label_names)} if label_names is not None else None
    save_for_hf(model, staging, model_config=model_config, safe_serialization=True)
    _finish_config(staging / CONFIG_NAME)


def save_pretrained(
    model: nn.Module,
    save_directory: str | os.PathLike,
    *,
    repo_id: str | None = None,
    label_names: Sequence[str] | None = None,
    training_results: "TrainingResults | None" = None,
) -> Path:
    """Write ``model`` as a Hub folder: ``model.safetensors``, ``config.json`` and, for an iris model, ``README.md``
    (the model card). Any timm model is written the same way (``timm.create_model("local-dir:<folder>")`` and
    transformers load it), without a card.

    Every file gets the permissions the umask gives a new file (0644 under umask 022). The folder is created if
    missing and a previous save is replaced; its other files are left alone, except weights
    in other formats (``pytorch_model.bin``, ...) that loaders could read instead, and the staging folders of saves
    that were killed, which are removed. The write is
    atomic with ``config.json`` as the commit point: the files are written and flushed in a temporary folder inside
    ``save_directory``, then ``config.json`` is removed, and the new files are renamed into place, ``config.json``
    last. A crash leaves the previous save, or a folder without ``config.json`` that loaders reject, never a mix of
    old and new files read as one model.

    Args:
        model: a model created by ``timm.create_model`` or ``iris_timm.from_pretrained``, which record the
            architecture and construction arguments (``model_args``) that ``config.json`` needs.
        save_directory: the folder to write.
        repo_id: the Hub repo these files are for; the card then loads ``"hf-hub:<repo_id>"`` rather than
            ``"local-dir:<save_directory>"``.
        label_names: one name per class, in classifier order. Loading puts them in ``pretrained_cfg["label_names"]``
            (timm) and ``config.id2label`` (transformers).
        training_results: what training measured, for an iris model's card; see
            ``iris_timm.model_card.TrainingResults``.

    Returns:
        The folder.
    """
    _check_saveable(model, label_names)
    # Imported here, not at the top: `python -m iris_timm.model_card` must find the module not imported yet.
    from .model_card import model_card

    directory = Path(save_directory)
    with _staging(directory) as staging:
        _write_timm_files(model, staging, label_names)
        if isinstance(model, IrisPDESSM):
            model_name = f"hf-hub:{repo_id}" if repo_id else f"local-dir:{directory}"
            model_card(model, model_name, training_results).save(staging / CARD_NAME)
    return directory


def push_to_hub(
    model: nn.Module,
    repo_id: str,
    *,
    commit_message: str = "Add model",
    private: bool | None = None,
    revision: str | None = None,
    create_pr: bool = False,
    token: str | None = None,
    label_names: Sequence[str] | None = None,
    training_results: "TrainingResults | None" = None,
) -> CommitInfo:
    """Publish ``model`` (an iris model, or any timm model) to the Hub repo ``repo_id`` as the folder
    ``save_pretrained`` writes, in one commit.

    The repo is created if missing (``private``: ``None`` follows the owner's default visibility), and the branch
    ``revision`` too. ``token`` defaults to huggingface_hub's usual places (``HF_TOKEN``, ``hf auth login``). Then
    ``timm.create_model("hf-hub:<repo_id>", pretrained=True)`` (after ``import iris_timm``) and transformers'
    ``AutoModelForImageClassification.from_pretrained(repo_id)`` load it.

    Returns:
        The commit, from ``HfApi.upload_folder``.
    """
    _check_saveable(model, label_names)  # before the repo is created
    # Not timm's push_to_hf_hub: it writes timm's generic README instead of the model card, a pickle beside the
    # safetensors, and num_classes into model_args, which transformers refuses.
    api = HfApi(token=token, library_name="timm", library_version=timm.__version__)
    repo_id = api.create_repo(repo_id, private=private, exist_ok=True).repo_id  # with the owner, if it was implicit
    if revision is not None:
        api.create_branch(repo_id, branch=revision, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        folder = save_pretrained(
            model, tmp, repo_id=repo_id, label_names=label_names, training_results=training_results
        )
        return api.upload_folder(
            repo_id=repo_id,
            folder_path=folder,
            commit_message=commit_message,
            revision=revision,
            create_pr=create_pr,
        )


def _is_hub_id(name: str) -> bool:
    """``ORG/NAME[@REVISION]`` as the Hub spells a repo id (one ``/`` between two names the Hub accepts, so nothing
    that starts like a path: ``.``, ``/``, ``~``), whose ``ORG`` is not a folder here (then it is a path inside it)."""
    repo_id = _split_revision(name)[0]
    if repo_id.count("/") != 1 or os.path.isdir(repo_id.split("/")[0]):
        return False
    try:
        validate_repo_id(repo_id)
    except HFValidationError:
        return False
    return True


def _parse_source(name_or_path: str | os.PathLike) -> tuple[str, str]:
    """``("local-dir", path)`` or ``("hf-hub", "ORG/NAME[@REVISION]")``, by the rule of :func:`from_pretrained`."""
    if os.path.islink(name_or_path) and not os.path.exists(name_or_path):
        raise FileNotFoundError(
            f"{name_or_path} is a symbolic link that leads nowhere (its target is missing, or links loop). Point it "
            "at the folder iris_timm.save_pretrained wrote."
        )
    if isinstance(name_or_path, os.PathLike):
        return "local-dir", os.fspath(name_or_path)
    source, _, location = name_or_path.partition(":")
    if source in ("hf-hub", "local-dir") and location:
        return source, location
    path = os.path.expanduser(name_or_path)
    if os.path.exists(path) or not _is_hub_id(name_or_path):
        return "local-dir", path  # a missing one is reported as a missing folder, never looked up on the Hub
    return "hf-hub", name_or_path


def _close_names(folder: Path) -> str:
    """``" (did you mean ...?)"`` naming folders beside ``folder`` with a similar name, or ``""``."""
    parent = folder.parent
    names = [p.name for p in parent.iterdir() if p.is_dir()] if parent.is_dir() else []
    close = difflib.get_close_matches(folder.name, names, n=2)
    return f" (did you mean {' or '.join(str(parent / name) for name in close)}?)" if close else ""


def _local_files(folder: Path) -> tuple[Path, Path]:
    """``config.json`` and ``model.safetensors`` of a folder, refusing pickled weights."""
    if not folder.exists():
        raise FileNotFoundError(
            f"No folder at {folder}{_close_names(folder)}. Give the folder iris_timm.save_pretrained wrote, or a Hub "
            "repo id ORG/NAME."
        )
    if not folder.is_dir():
        pickled = f" It is a pickle: {_CONVERT_PICKLE}" if folder.suffix in PICKLE_SUFFIXES else ""
        raise NotADirectoryError(
            f"{folder} is a file; from_pretrained reads a folder holding {CONFIG_NAME} and {WEIGHTS_NAME}, as "
            f"iris_timm.save_pretrained writes.{pickled}"
        )
    weights, config = folder / WEIGHTS_NAME, folder / CONFIG_NAME
    if not weights.is_file():
        pickles = sorted(path.name for path in folder.iterdir() if path.suffix in PICKLE_SUFFIXES)
        if pickles:
            raise FileNotFoundError(
                f"{folder} holds no {WEIGHTS_NAME}, only pickled weights {pickles}. {_CONVERT_PICKLE}"
            )
        raise FileNotFoundError(f"{weights} not found. Save the model there with iris_timm.save_pretrained.")
    if not config.is_file():
        raise FileNotFoundError(
            f"{config} not found: the folder is not a complete save (an interrupted save removes it). Save the model "
            "there again with iris_timm.save_pretrained."
        )
    return config, weights


def _split_revision(model_id: str) -> tuple[str, str | None]:
    """``"ORG/NAME@REVISION"`` as ``("ORG/NAME", "REVISION")``; the revision is ``None`` when not given."""
    repo_id, _, revision = model_id.partition("@")
    return repo_id, revision or None


def _hub_snapshot(
    model_id: str, revision: str | None, token: str | bool | None, cache_dir: str | os.PathLike | None
) -> Path:
    """The folder of a Hub repo's ``config.json`` and ``model.safetensors``, both of one commit (``revision``, or the
    one ``model_id`` names after ``@``; the default branch without either), from the cache when it holds them
    (always, offline). The cache names the folder by that commit."""
    repo_id, named = _split_revision(model_id)
    if named is not None and revision is not None and named != revision:
        raise ValueError(
            f"{model_id} names the revision {named!r} and revision={revision!r} another: give the revision once."
        )
    revision = revision or named
    try:
        folder = snapshot_download(
            repo_id, revision=revision, token=token, cache_dir=cache_dir, allow_patterns=[CONFIG_NAME, WEIGHTS_NAME]
        )
    except LocalEntryNotFoundError as e:
        raise FileNotFoundError(
            f"hf-hub:{model_id} is not in the Hugging Face cache and the Hub cannot be reached. Download it once "
            f"online, or give a local folder. ({e})"
        ) from e
    for name, advice in [
        (CONFIG_NAME, "Publish the model with iris_timm.push_to_hub."),
        (WEIGHTS_NAME, _CONVERT_PICKLE),
    ]:
        if not (Path(folder) / name).is_file():
            raise FileNotFoundError(f"hf-hub:{model_id} has no {name}. {advice}")
    return Path(folder)


def _checked_hub_snapshot(
    name_or_path: str,
    model_id: str,
    revision: str | None,
    token: str | bool | None,
    cache_dir: str | os.PathLike | None,
) -> Path:
    """:func:`_hub_snapshot`; where ``name_or_path`` was a bare ``ORG/NAME`` (no ``hf-hub:``), which could also have
    meant a folder, a failure says that neither exists."""
    try:
        return _hub_snapshot(model_id, revision, token, cache_dir)
    except OSError as e:  # FileNotFoundError, and huggingface_hub's HTTP and offline errors
        if name_or_path.startswith("hf-hub:"):
            raise
        raise FileNotFoundError(f"No folder at {name_or_path}; as a Hub repo: {e}") from e


def _read_config(path: Path) -> dict[str, Any]:
    """``config.json``, checked to be timm's hub config naming an architecture timm knows."""
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:  # json.JSONDecodeError, UnicodeDecodeError
        raise ValueError(f"{path} is not valid JSON ({e}). Save the model again with iris_timm.save_pretrained.") from e
    if not isinstance(config, dict):
        raise ValueError(f"{path} holds a JSON {type(config).__name__}, not timm's config object.")
    missing = [key for key in REQUIRED_CONFIG_KEYS if key not in config]
    if missing:
        raise ValueError(
            f"{path} lacks the key(s) {missing} of timm's hub config. Save the model again with "
            "iris_timm.save_pretrained."
        )
    for key in ("pretrained_cfg", "model_args"):
        if not isinstance(config.get(key, {}), dict):
            raise ValueError(f"{path}: {key!r} must be a JSON object, got {json.dumps(config[key])}.")
    if not timm.is_model(config["architecture"]):
        raise ValueError(
            f"{path} names the architecture {config['architecture']!r}, which timm does not know. The iris "
            f"architectures are {timm.list_models('iris_*')}; a model from another package needs that package "
            "imported first."
        )
    _check_version(path, config)
    return config


def from_pretrained(
    name_or_path: str | os.PathLike,
    *,
    revision: str | None = None,
    token: str | bool | None = None,
    cache_dir: str | os.PathLike | None = None,
    **kwargs: Any,
) -> nn.Module:
    """Create a model from a folder ``save_pretrained`` wrote or from a Hub repo, with its weights.

    The same as ``timm.create_model("local-dir:PATH" | "hf-hub:ORG/NAME", pretrained=True, **kwargs)`` (the weights
    read once), after checks that turn bad input into an error naming the file or key at fault,
    raised before any weights are read: ``config.json`` must be timm's hub config with an architecture timm knows,
    written by a version of iris_timm that builds it; ``model.safetensors`` a complete safetensors file (pickled
    weights are refused, never loaded) whose tensors' names, shapes and dtypes fit the model (its header is
    checked against the model built on the meta device). Weights holding NaN or infinity are refused as an iris
    model's ``checkpoint_filter_fn`` receives them, and once loaded for another timm model. Offline
    (``HF_HUB_OFFLINE=1``) a Hub repo loads from the local cache.

    Which names a folder and which a Hub repo: ``"local-dir:PATH"`` and a ``PathLike`` are folders, and
    ``"hf-hub:ORG/NAME"`` a repo. Any other string is a folder if one exists there (``~`` expanded), and otherwise a
    repo only if it reads as a Hub repo id ``ORG/NAME[@REVISION]``: one ``/`` between two names the Hub accepts,
    with no folder ``ORG`` here. Everything else (``no_such_dir``, ``./x``, ``x/``, ``../x``, ``/abs/x``, ``~/x``,
    ``a/b/c``, ``output/typo`` where ``output/`` exists) raises ``FileNotFoundError`` saying that no such folder
    exists, before the Hub is asked; a repo id that is not on the Hub either (or cannot be reached) says both.

    Args:
        name_or_path: ``"local-dir:PATH"``, ``"hf-hub:ORG/NAME[@REVISION]"``, a folder, or a Hub repo id
            ``"ORG/NAME[@REVISION]"`` (an existing folder of that name wins).
        revision: a Hub repo's branch, tag or commit (as huggingface_hub's ``revision``); the same as ``@REVISION``.
        token: the Hub token for a private repo (as huggingface_hub's ``token``); by default huggingface_hub's
            usual places (``HF_TOKEN``, ``hf auth login``).
        cache_dir: the Hugging Face cache to use instead of the default one.
        **kwargs: passed to ``timm.create_model`` over the saved ``model_args``: ``num_classes`` (a new head, the
            backbone kept), ``in_chans`` (the first convolution adapted by timm's ``adapt_input_conv``),
            ``features_only``, ``drop_path_rate``, ``dtype`` (build the model in this dtype: the file's tensors
            must be in it; without it they must be in the model's default dtype, float32, and none is cast) ...

    Raises:
        FileNotFoundError: a missing folder or file, or a folder holding only pickled weights.
        NotADirectoryError: a file where a folder is expected.
        ValueError: an invalid ``config.json``, model_args timm cannot build, a truncated or corrupt
            ``model.safetensors``, weights whose names or shapes do not fit the model, in another dtype, or
            holding NaN or infinity.
    """
    source, location = _parse_source(name_or_path)
    if source == "local-dir":
        if revision is not None:
            raise ValueError(f"revision={revision!r} selects a commit of a Hub repo, and {location} is a local folder.")
        config_path, weights_path = _local_files(Path(location))
        model_name = f"local-dir:{location}"
    else:
        snapshot = _checked_hub_snapshot(name_or_path, location, revision, token, cache_dir)
        config_path, weights_path = snapshot / CONFIG_NAME, snapshot / WEIGHTS_NAME
        # Pinned to the commit the checked files came from.
        model_name = f"hf-hub:{_split_revision(location)[0]}@{snapshot.name}"
    config = _read_config(config_path)
    try:  # the header's names, shapes and dtypes against the model, built on the meta device
        check_weights_file(weights_path, model_name, cache_dir=cache_dir, **kwargs)
    except TypeError as e:  # an argument the model does not take
        raise ValueError(
            f"{config_path}: timm cannot build {config['architecture']!r} with model_args "
            f"{config.get('model_args', {})}: {e}. Correct model_args, or save the model again."
        ) from e
    model = timm.create_model(model_name, pretrained=True, cache_dir=cache_dir, **kwargs)
    # An iris model's checkpoint_filter_fn checked the values as they loaded; another model's are checked here.
    if not config["architecture"].startswith("iris_"):
        check_weights(model.state_dict(), None, str(weights_path))
    return model
