#!/usr/bin/env python3
"""Checks that docs/ARCHITECTURE.md and docs/INTERNALS.md name only things
that exist.

Every `code span` of the document that looks like a path (it has a slash
or a source file's extension) must name a file or folder of the
repository: a path with a slash from the repository root or from one of
the folders the document is about (daemon/engine/, tiers/, ...), a bare
file name anywhere in it; `{a,b}` expands and `*` globs. Every span that
looks like a C++ name (CamelCase, or `Type::Member`) must occur as a word
in the sources (C++, protobuf, Python), so that a renamed class or method
shows up here instead of drifting. Run as: check_architecture_doc.py ROOT
[DOC...] (default: both documents). Exits 1 and lists what it did not
find.
"""
import fnmatch
import glob
import itertools
import os
import re
import sys

SOURCE_SUFFIXES = (".h", ".cc", ".c", ".cu", ".cuh", ".proto", ".py", ".cmake", ".sh", ".txt",
                   ".toml", ".service", ".md", ".json", ".in")
CODE_SUFFIXES = (".h", ".cc", ".c", ".cu", ".cuh", ".proto", ".py")
SKIP_DIRS = {".git", "build", "__pycache__", "node_modules"}
PATH_RE = re.compile(r"^[A-Za-z0-9_.\-/{},*]+$")
NAME_RE = re.compile(r"^[A-Z][A-Za-z0-9]*[a-z][A-Za-z0-9]*(::[A-Za-z_][A-Za-z0-9_]*)*(\(\))?$")


def expand_braces(text):
    m = re.search(r"\{([^{}]*)\}", text)
    if not m:
        return [text]
    out = []
    for choice in m.group(1).split(","):
        out.extend(expand_braces(text[:m.start()] + choice + text[m.end():]))
    return out


def repo_files(root):
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS]
        for name in filenames:
            files.append(os.path.relpath(os.path.join(dirpath, name), root))
    return files


def looks_like_path(span):
    if " " in span or not PATH_RE.match(span) or span.startswith(("-", ".")) and "/" not in span:
        return False
    if "://" in span or span.startswith("/"):
        return False  # a URL or a path on the machine, not in the repository
    if "/" in span:
        # A folder or file of ours; not an option value like "a/b" of prose.
        first = span.split("/")[0]
        return first in TOP_LEVEL
    return span.endswith(SOURCE_SUFFIXES) and not span.startswith("kvtier.")


def path_exists(root, span, basenames, folders):
    for candidate in expand_braces(span.rstrip("/")):
        if "*" in candidate:
            if "/" in candidate and glob.glob(os.path.join(root, candidate)):
                continue
            if "/" not in candidate and fnmatch.filter(basenames, candidate):
                continue
            return False
        if "/" in candidate:
            if os.path.exists(os.path.join(root, candidate)):
                continue
            return False
        if candidate in basenames or candidate in folders:
            continue
        return False
    return True


def main():
    root = sys.argv[1]
    docs = sys.argv[2:] or [os.path.join(root, "docs", name) for name in ("ARCHITECTURE.md", "INTERNALS.md")]
    global TOP_LEVEL
    TOP_LEVEL = {e for e in os.listdir(root) if e not in SKIP_DIRS}
    files = repo_files(root)
    basenames = {os.path.basename(f) for f in files}
    folders = {os.path.basename(os.path.dirname(f)) for f in files}
    words = set()
    for f in files:
        if f.endswith(CODE_SUFFIXES):
            with open(os.path.join(root, f), encoding="utf-8", errors="replace") as src:
                words.update(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", src.read()))
    failed = False
    for doc in docs:
        with open(doc, encoding="utf-8") as d:
            text = d.read()
        # Fenced blocks are diagrams; only inline spans are names.
        text = re.sub(r"```.*?```", "", text, flags=re.S)
        missing = []
        for span in re.findall(r"`([^`\n]+)`", text):
            span = span.strip()
            if looks_like_path(span):
                if not path_exists(root, span, basenames, folders):
                    missing.append(f"no file or folder {span}")
            elif NAME_RE.match(span):
                for part in span.rstrip("()").split("::"):
                    if part not in words:
                        missing.append(f"no name {part} (in `{span}`) in the sources")
        if missing:
            failed = True
            print(f"{doc} names what the repository does not have:")
            for m in sorted(set(missing)):
                print("  " + m)
        else:
            print(f"{doc}: every file and name it gives exists")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
