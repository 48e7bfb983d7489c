#!/usr/bin/env python3
"""tools/sass_stats.py — per-kernel instruction counts of `cuobjdump -sass` listings (tools/sass_stats.sh makes them).

usage: sass_stats.py NAME=FILE.sass [NAME=FILE.sass ...] [--ops HGMMA,MUFU,BRA,BSSY,...] [--match SUBSTRING]

Prints one row per kernel and listing: the listing's NAME, the kernel (the mangled name cut to its template part),
the number of SASS instructions and the count of each opcode in --ops (an opcode counts by its first dot-separated
part, predicated or not: `@!P0 BRA` is a BRA). BSSY / BSYNC pairs mark divergent regions: a masked select that
ptxas turned into a branch per element shows there (bench/NOTES.md 15); STL / LDL are register spills.
Exit status 2 when any listing holds no kernel (or none matching --match); the others are still printed.
"""
import argparse
import collections
import re
import sys

DEFAULT_OPS = "HGMMA,MUFU,FMNMX,FSEL,BRA,BSSY,R2UR,STL,LDL"


def kernels(text):
    """(name, [instruction text]) for each `Function :` section of a cuobjdump -sass listing."""
    out = []
    for part in re.split(r"\n\s*Function : ", text)[1:]:
        name = part.split("\n", 1)[0].strip()
        ins = re.findall(r"/\*[0-9a-f]{4,6}\*/\s+([^;\n]*);", part)
        out.append((name, [i.strip() for i in ins]))
    return out


def short(name):
    """The kernel's identifier and template arguments from an Itanium-mangled name, e.g. k_fwd_wgILi2ELi128ELb0ELb1E."""
    m = re.search(r"\d+(k_\w+?)(I\w*?E)E", name) or re.search(r"\d+(\w+?)(I\w*?E)?E[vN]", name)
    return (m.group(1) + (m.group(2) or "")) if m else name[:60]


def opcode(ins):
    word = ins.split()[1] if ins.startswith("@") and len(ins.split()) > 1 else ins.split()[0]
    return word.split(".")[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("listings", nargs="+", help="NAME=FILE.sass")
    ap.add_argument("--ops", default=DEFAULT_OPS)
    ap.add_argument("--match", default="")
    a = ap.parse_args()
    ops = [o for o in a.ops.split(",") if o]
    rows, empty = [], []
    for spec in a.listings:
        label, _, path = spec.partition("=")
        if not path:
            label, path = spec, spec
        n = len(rows)
        with open(path, encoding="utf-8", errors="replace") as f:
            for name, ins in kernels(f.read()):
                if a.match not in short(name):
                    continue
                c = collections.Counter(opcode(i) for i in ins if i)
                rows.append([label, short(name), str(len(ins))] + [str(c[o]) for o in ops])
        if len(rows) == n:
            empty.append(f"{label} ({path})")
    for e in empty:
        print(f"sass_stats: no kernel{f' matching {a.match!r}' if a.match else ''} in {e}", file=sys.stderr)
    if not rows:
        return 2
    head = ["listing", "kernel", "instructions"] + ops
    width = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]
    for r in [head] + rows:
        print("  ".join(v.ljust(w) if i < 2 else v.rjust(w) for i, (v, w) in enumerate(zip(r, width))))
    return 2 if empty else 0


if __name__ == "__main__":
    sys.exit(main())
