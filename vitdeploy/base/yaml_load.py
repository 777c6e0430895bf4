"""Read a YAML file the way a server reads untrusted input: bounded in size, depth and expansion.

``yaml.safe_load`` constructs no objects, but it still lets a 1 KB file describe a billion nodes
through anchors and aliases ("billion laughs"), or nest 10 000 flow sequences until Python's
recursion limit. Here the file is refused (ConfigError, exit 2) when it is larger than
MAX_YAML_BYTES, nests deeper than MAX_YAML_DEPTH, or expands to more than MAX_YAML_NODES nodes
with its aliases followed. Aliases within that budget are allowed (``fp16: *tolerance`` is a fair
use); a pipeline.yaml is a few hundred nodes at most.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .errors import ConfigError
from .limits import MAX_YAML_BYTES, MAX_YAML_DEPTH, MAX_YAML_NODES, clip_text


def load_yaml_file(path: Path) -> Any:
    """The document in ``path`` (None for an empty file); ConfigError naming the file otherwise."""
    import yaml

    try:
        size = path.stat().st_size
        if size > MAX_YAML_BYTES:
            raise ConfigError(
                f"{path}: {size} bytes is larger than the {MAX_YAML_BYTES} bytes a pipeline YAML may be; "
                f"is this the right file?"
            )
        with open(path, "rb") as fh:
            raw = fh.read(MAX_YAML_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the file ({exc.strerror or exc})") from None
    if len(raw) > MAX_YAML_BYTES:  # grew while we looked
        raise ConfigError(f"{path}: larger than the {MAX_YAML_BYTES} bytes a pipeline YAML may be")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    try:
        _check_depth(text, path)
        loader = yaml.SafeLoader(text)
        try:
            node = loader.get_single_node()
            if node is None:
                return None
            _check_expansion(node, path)
            return loader.construct_document(node)
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        at = f" at line {where.line + 1}, column {where.column + 1}" if where else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{path}: invalid YAML{at}: {clip_text(problem)}") from None
    except (ValueError, OverflowError) as exc:  # e.g. an integer of 100 000 digits
        raise ConfigError(f"{path}: a value cannot be read: {clip_text(str(exc))}") from None
    except RecursionError:  # pragma: no cover - _check_depth refuses deep documents first
        raise ConfigError(f"{path}: nested too deeply to read") from None


def _check_depth(text: str, path: Path) -> None:
    """Walk the event stream (no recursion, no objects) and refuse deep nesting early."""
    import yaml

    depth = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
            if depth > MAX_YAML_DEPTH:
                mark = event.start_mark
                raise ConfigError(
                    f"{path}: nested more than {MAX_YAML_DEPTH} levels deep (at line {mark.line + 1}, "
                    f"column {mark.column + 1}); a pipeline YAML is a few levels of sections and keys"
                )
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1


def _check_expansion(root: Any, path: Path) -> None:
    """Count the nodes the document stands for with every alias expanded (memoised per node, so
    counting costs the size of the file, not of the expansion)."""
    import yaml

    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()  # expanded, not finished: the current path from the root
    # Iterative post-order over the node graph (aliases are shared node objects).
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        if id(node) in sizes:
            continue
        if not children_done and id(node) in open_nodes:
            raise ConfigError(f"{path}: an alias refers to a node that contains it (a recursive anchor); refusing it")
        if isinstance(node, yaml.ScalarNode):
            sizes[id(node)] = 1
            continue
        children = [c for pair in node.value for c in pair] if isinstance(node, yaml.MappingNode) else list(node.value)
        if not children_done:
            open_nodes.add(id(node))
            stack.append((node, True))
            stack.extend((c, False) for c in children if id(c) not in sizes)
            continue
        open_nodes.discard(id(node))
        total = 1 + sum(sizes.get(id(c), 0) for c in children)
        sizes[id(node)] = total
        if total > MAX_YAML_NODES:
            raise ConfigError(
                f"{path}: expands to more than {MAX_YAML_NODES} values once its anchors and aliases "
                f"(&name / *name) are followed; refusing it (a pipeline YAML has a few hundred)"
            )
