#!/usr/bin/env python3
"""Checks tierflow's layering on the include graph (issue 33, item 8).

The rule: the library's layers, lowest first, are

    core < platform < metrics < topology < memory < device < schedule < optim < session < capi

and a file may include headers of its own layer or of a layer below it, never above. The
umbrella tierflow.hpp sits above capi (it may include everything; nothing in lib/ may include
it), and tools/, bench/ and examples/ sit above all of them, but reach the library only through
its public headers (include/tierflow/..., tierflow/detail/ included): no file outside lib/
includes a file under lib/. The Python package (python/tierflow) reaches it only through the C
ABI, so no .py file there names a path under lib/.

Usage: check_layers.py REPO_ROOT   (or --self-test). Every `#include "..."` (and every
`#include <...>` that names a file of the tree) in a C/C++ file under include/, lib/, tools/,
bench/ and examples/ is mapped to a layer with the tables below. A file or a header they do not
map is a violation, as is a table entry naming a path that no longer exists: new headers must
be classified, and the tables cannot rot. Prints each violation as
`path:line: <layer of file> includes <header> (<layer of header>)` and exits 1; else prints one
summary line and exits 0.
"""
import os
import re
import subprocess
import sys
import tempfile

LAYERS = ["core", "platform", "metrics", "topology", "memory", "device", "schedule", "optim",
          "session", "capi", "umbrella", "tools"]

# Path prefix (relative to the repository root) -> layer, for everything but include/.
PREFIXES = {
    "lib/core/": "core", "lib/platform/": "platform", "lib/metrics/": "metrics",
    "lib/topology/": "topology", "lib/memory/": "memory", "lib/device/": "device",
    "lib/schedule/": "schedule", "lib/optim/": "optim", "lib/session/": "session",
    "lib/capi/": "capi", "tools/": "tools", "bench/": "tools", "examples/": "tools",
}

# Public header (relative to include/) -> layer; each one by name, so a new one must be added.
PUBLIC = {
    "tierflow/build_config.hpp": "core", "tierflow/error.hpp": "core",
    "tierflow/log.hpp": "core", "tierflow/settings.hpp": "core",
    "tierflow/detail/enum_names.hpp": "core", "tierflow/detail/input_file.hpp": "core",
    "tierflow/detail/parse.hpp": "core", "tierflow/detail/stats.hpp": "core",
    "tierflow/detail/stagger.hpp": "core",
    "tierflow/metrics.hpp": "metrics", "tierflow/exporters.hpp": "metrics",
    "tierflow/topology.hpp": "topology",
    "tierflow/memory_resource.hpp": "memory", "tierflow/numa_resource.hpp": "memory",
    "tierflow/pinned_resource.hpp": "memory", "tierflow/pool_resource.hpp": "memory",
    "tierflow/limit_resource.hpp": "memory", "tierflow/statistics_resource.hpp": "memory",
    "tierflow/placement_policy.hpp": "memory", "tierflow/where.hpp": "memory",
    "tierflow/device.hpp": "device", "tierflow/emulated_device.hpp": "device",
    "tierflow/transfer_engine.hpp": "device",
    "tierflow/prefetch_scheduler.hpp": "schedule", "tierflow/schedule_model.hpp": "schedule",
    "tierflow/offload_adam.hpp": "optim", "tierflow/detail/adam_bound.hpp": "optim",
    "tierflow/detail/adam_kernels.hpp": "optim", "tierflow/detail/adam_scalars.hpp": "optim",
    "tierflow/detail/device_adam.hpp": "optim", "tierflow/detail/adam_state.hpp": "optim",
    "tierflow/detail/adam_master.hpp": "optim",
    "tierflow/session.hpp": "session",
    "tierflow/tierflow.h": "capi",
    "tierflow/tierflow.hpp": "umbrella",
}

# Public headers CMake generates into the build tree -> the template they come from.
GENERATED = {"tierflow/build_config.hpp": "cmake/build_config.hpp.in"}

SCANNED = ("include", "lib", "tools", "bench", "examples")
SOURCE_SUFFIXES = (".c", ".cpp", ".cu", ".h", ".hpp", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')
LIB_PATH = re.compile(r"\blib/(%s)/" % "|".join(p[4:-1] for p in PREFIXES if p[:4] == "lib/"))


def layer_of(path):
    """The layer of a repository-relative path, or None."""
    if path.startswith("include/"):
        return PUBLIC.get(path[len("include/"):])
    return next((layer for prefix, layer in PREFIXES.items() if path.startswith(prefix)), None)


def resolve(root, includer, header, quoted):
    """The repository-relative path `#include header` in `includer` names, or None.

    Searched as the build's include paths do: the includer's folder (quoted form only), then
    include/ (and the generated headers), then lib/ for the library or tools/tierflow for the
    rest (tools/ and bench/ build with -I tools/tierflow).
    """
    bases = ["include", "lib", "tools/tierflow"]
    if not includer.startswith("lib/"):
        bases = ["include", "tools/tierflow", "lib"]
    if quoted:
        bases.insert(0, os.path.dirname(includer))
    for base in bases:
        candidate = os.path.normpath(os.path.join(base, header))
        if os.path.isfile(os.path.join(root, candidate)):
            return candidate
    return "include/" + header if header in GENERATED else None


def stale_entries(root):
    """Table entries that name no existing path."""
    stale = [p for p in PREFIXES if not os.path.isdir(os.path.join(root, p))]
    for header in PUBLIC:
        path = GENERATED.get(header, "include/" + header)
        if not os.path.isfile(os.path.join(root, path)):
            stale.append(path)
    return stale


def check(root):
    """Returns (violations, files scanned, includes checked)."""
    violations = ["%s: table entry names no existing path" % p for p in stale_entries(root)]
    sources = []
    for top in SCANNED:
        for folder, dirs, files in os.walk(os.path.join(root, top)):
            dirs.sort()
            sources += [os.path.relpath(os.path.join(folder, f), root)
                        for f in sorted(files) if f.endswith(SOURCE_SUFFIXES)]
    checked = 0
    for path in sources:
        layer = layer_of(path)
        if layer is None:
            violations.append("%s:1: unknown layer (not in check_layers.py's tables)" % path)
            continue
        with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
            for number, line in enumerate(f, 1):
                match = INCLUDE.match(line)
                if not match:
                    continue
                quoted, header = match.group(1) == '"', match.group(2)
                target = resolve(root, path, header, quoted)
                if target is None and not quoted:
                    continue  # a system header
                checked += 1
                target_layer = layer_of(target) if target else None
                if target_layer is None:
                    why = "unknown layer"
                elif not path.startswith("lib/") and target.startswith("lib/"):
                    why = target_layer + ", private to lib/"
                elif LAYERS.index(target_layer) > LAYERS.index(layer):
                    why = target_layer
                else:
                    continue
                violations.append("%s:%d: %s includes %s (%s)" % (path, number, layer, header, why))
    python_dir = os.path.join(root, "python", "tierflow")
    for name in sorted(os.listdir(python_dir)) if os.path.isdir(python_dir) else []:
        if name.endswith(".py"):
            with open(os.path.join(python_dir, name), encoding="utf-8", errors="replace") as f:
                for number, line in enumerate(f, 1):
                    if LIB_PATH.search(line):
                        violations.append("python/tierflow/%s:%d: python names %s (only the C "
                                          "ABI is public)" % (name, number, line.strip()))
    return violations, len(sources), checked


def self_test():
    """Runs this script on small trees: clean, and with each kind of violation."""
    cases = [
        ({"lib/topology/x.cpp": '#include "tierflow/topology.hpp"\n'}, 0, None),
        ({"lib/topology/x.cpp": '#include "tierflow/offload_adam.hpp"\n'}, 1,
         "lib/topology/x.cpp:1: topology includes tierflow/offload_adam.hpp (optim)"),
        ({"tools/tierflow/t.cpp": '#include <vector>\n#include "core/threads.hpp"\n'}, 1,
         "tools/tierflow/t.cpp:2: tools includes core/threads.hpp (core, private to lib/)"),
        ({"lib/memory/y.cpp": '#include "tierflow/tierflow.hpp"\n'}, 1,
         "lib/memory/y.cpp:1: memory includes tierflow/tierflow.hpp (umbrella)"),
        ({"lib/core/z.cpp": '#include "tierflow/new.hpp"\n'}, 1,
         "lib/core/z.cpp:1: core includes tierflow/new.hpp (unknown layer)"),
        ({"include/tierflow/new.hpp": ""}, 1, "include/tierflow/new.hpp:1: unknown layer"),
        ({"python/tierflow/m.py": 'open("../lib/optim/adam_core.hpp")\n'}, 1,
         "python/tierflow/m.py:1: python names"),
        ({"-include/tierflow/where.hpp": ""}, 1, "include/tierflow/where.hpp: table entry"),
    ]
    failures = 0
    for extra, want_rc, want_line in cases:
        with tempfile.TemporaryDirectory() as root:
            files = {p: "" for p in (GENERATED.get(h, "include/" + h) for h in PUBLIC)}
            files.update({p + ".keep": "" for p in PREFIXES})
            files["lib/core/threads.hpp"] = ""
            files.update(extra)  # a leading "-" removes that file instead
            for rel, text in files.items():
                if rel.startswith("-"):
                    os.remove(os.path.join(root, rel[1:]))
                    continue
                os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
                with open(os.path.join(root, rel), "w", encoding="utf-8") as f:
                    f.write(text)
            run = subprocess.run([sys.executable, __file__, root], capture_output=True,
                                 text=True, check=False)
            if run.returncode != want_rc or (want_line and want_line not in run.stdout):
                failures += 1
                print("self-test FAILED on %s: exit %d, wanted %d and %r; output:\n%s"
                      % (sorted(extra), run.returncode, want_rc, want_line, run.stdout))
    print("layering self-test: %d of %d cases passed" % (len(cases) - failures, len(cases)))
    return 1 if failures else 0


def main(argv):
    if argv[1:] == ["--self-test"]:
        return self_test()
    if len(argv) != 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    violations, files, checked = check(argv[1])
    for violation in violations:
        print(violation)
    if violations:
        print("layering: %d violation(s)" % len(violations))
        return 1
    print("layering: %d files, %d includes checked, 0 upward" % (files, checked))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
