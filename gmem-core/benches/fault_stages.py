#!/usr/bin/env python3
"""Where a 4 KiB first-touch fault's instructions go, stage by stage.

Runs the `fault` bench binary in its profile mode (GMEM_FAULT_PROFILE=N: N batches of
4096 first-touch faults through `dev_fault` in one region, nothing else) under
callgrind, reads the inclusive call tree (`callgrind_annotate --tree=calling`) and
splits the instructions of `Gmem::dev_fault` into stages by the function that spends
them:

  entry          dev_fault itself: device and space lookup, the space lock
  lookup+checks  SpaceState::fault's own code: region and piece lookup, protection
                 check, placement target, logical page table reads
  frame alloc    alloc_frame and below (reservation lookup, physmem, vmem arena)
  LPT update     lpt::LogicalPageTable functions that were not inlined
  map core       map_for_fault / map_run / install_run / mirror, without the driver
                 call (inlined into the fault when the table has no large leaves: then
                 counted in lookup+checks)
  driver placement  the test driver's DeviceMemory::frame_request / frame_class answers
                 (called from the fault's own code; counted apart since round 11)
  test MMU map   the test driver's Mmu::map (a leaf-block probe, an array write per page)
  zeroing        DeviceMemory::zero (excluded from the target; a no-op in test memory)

A function inlined into its caller counts as its caller's: read the stages as "code
reached from here", not as exact source functions. Instruction counts, not time; the
bench's printed ns/fault is the timing.

With --atomics it counts instead the atomic read-modify-writes a fault executes
(x86-64 `lock`-prefixed instructions and `xchg` with memory, which the CPU locks
implicitly): callgrind runs with --toggle-collect on dev_fault and --dump-instr=yes,
each such instruction of `objdump -d` is looked up in the per-instruction counts, and
the script prints how many times per fault each one ran, with the function it is in.
Callgrind weighs an atomic like any instruction; on hardware each costs about 20 cycles
uncontended, more when its line bounces between CPUs.

Usage: python3 gmem-core/benches/fault_stages.py [--atomics] [bench-binary]
(default: the newest target/release/deps/fault-*; build it with
`cargo bench -p gmem-core --bench fault --no-run`).
"""

import glob
import os
import re
import subprocess
import sys
import tempfile

STAGES = [
    ("test MMU map", re.compile(r"as gmem_core::mmu::Mmu>::map$")),
    ("driver placement", re.compile(r"as gmem_core::mmu::DeviceMemory>::frame_(request|class)$")),
    ("zeroing", re.compile(r"as gmem_core::mmu::DeviceMemory>::zero$")),
    ("frame alloc", re.compile(r"alloc_frame$|alloc_placed$|::physmem::|::vmem::|DeviceInner::alloc_")),
    ("LPT update", re.compile(r"gmem_core::lpt::")),
    ("map core", re.compile(r"map_for_fault$|map_run$|::mirror$|map_block|install_run$")),
    ("lookup+checks", re.compile(r"SpaceState>::fault$|region_at|segments::|target_of$")),
    ("entry", re.compile(r"Gmem>::dev_fault$")),
]
ORDER = ["entry", "lookup+checks", "frame alloc", "LPT update", "map core", "driver placement",
         "test MMU map", "zeroing"]
# The test driver's own code: everything else is the core's.
DRIVER = ["driver placement", "test MMU map", "zeroing"]
LINE = re.compile(r"^\s*([\d,]+)\s+\([^)]*\)\s+([*><])\s+(.*?)(?: \(([\d,]+)x\))?(?: \[[^\]]*\])?\s*$")


def stage_of(name):
    for stage, pat in STAGES:
        if pat.search(name):
            return stage
    return None


def parse(tree):
    """{function: (inclusive, [(callee, cost)])} from a --tree=calling listing."""
    funcs, cur = {}, None
    for line in tree.splitlines():
        m = LINE.match(line)
        if not m:
            if not line.strip():
                cur = None
            continue
        cost, kind, name = int(m.group(1).replace(",", "")), m.group(2), m.group(3)
        name = name.split(":", 1)[1] if ":" in name else name
        if kind == "*":
            cur = name
            # A function appears once per source file its code came from (inlined
            # library code is listed under the library's file): its inclusive cost is
            # the largest of these, the one its callers' edges carry.
            incl, calls = funcs.get(name, (0, []))
            funcs[name] = (max(incl, cost), calls)
        elif kind == ">" and cur is not None:
            funcs[cur][1].append((name, cost))
    return funcs


def split(funcs, name, inherited, memo, depth=0):
    """Fractions of `name`'s inclusive cost per stage."""
    key = (name, inherited)
    if key in memo:
        return memo[key]
    stage = stage_of(name) or inherited
    incl, calls = funcs.get(name, (0, []))
    out = {}
    if incl == 0 or depth > 40:
        memo[key] = {stage: 1.0}
        return memo[key]
    memo[key] = {stage: 1.0}  # guards recursion
    rest = incl
    for callee, cost in calls:
        if callee == name:
            continue
        rest -= cost
        for s, f in split(funcs, callee, stage, memo, depth + 1).items():
            out[s] = out.get(s, 0.0) + f * cost / incl
    out[stage] = out.get(stage, 0.0) + max(rest, 0) / incl
    memo[key] = out
    return out


ATOMIC = re.compile(r"lock\b|xchg\b.*\(")
DIS = re.compile(r"\s*([0-9a-f]+):\s+(.*)")


def instr_counts(out):
    """{object: {address: executions}} from a --dump-instr=yes --compress-pos=no
    --compress-strings=no callgrind file (each instruction's Ir is its executions), and
    {(object, address): function}."""
    counts, fn_of = {}, {}
    ob = fn = None
    skip = False
    with open(out) as f:
        for line in f:
            if line.startswith("ob="):
                ob = line[3:].strip()
            elif line.startswith("fn="):
                fn = line[3:].strip()
            elif line.startswith("calls="):
                skip = True  # the next cost line is the call's inclusive cost
            elif line.startswith("0x"):
                if skip:
                    skip = False
                    continue
                addr, _line, ir = line.split()[:3]
                a = int(addr, 16)
                obj = counts.setdefault(ob, {})
                obj[a] = obj.get(a, 0) + int(ir)
                fn_of[(ob, a)] = fn
    return counts, fn_of


def atomics(binary, batches):
    """Print the atomic read-modify-writes per fault, by instruction."""
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "cg.out")
        env = dict(os.environ, GMEM_FAULT_PROFILE=str(batches))
        run = subprocess.run(
            ["valgrind", "--tool=callgrind", "--dump-instr=yes", "--compress-pos=no",
             "--compress-strings=no", "--toggle-collect=*Gmem*dev_fault*",
             f"--callgrind-out-file={out}", binary],
            env=env, capture_output=True, text=True, check=True)
        faults = int(re.search(r"profile: (\d+) faults", run.stdout).group(1))
        counts, fn_of = instr_counts(out)
    total, rows = 0, []
    for obj, by_addr in counts.items():
        dis = subprocess.run(["objdump", "-d", "--no-show-raw-insn", obj],
                             capture_output=True, text=True, check=True).stdout
        for line in dis.splitlines():
            m = DIS.match(line)
            if not m or not ATOMIC.match(m.group(2)):
                continue
            a = int(m.group(1), 16)
            n = by_addr.get(a, 0)
            if n:
                total += n
                rows.append((n, m.group(2).split("#")[0].strip(), fn_of[(obj, a)]))
    print(f"{binary}: {faults} first-touch 4 KiB faults under callgrind")
    for n, ins, fn in sorted(rows, key=lambda r: -r[0]):
        if n / faults >= 0.01:
            print(f"  {n / faults:5.2f}  {ins:<34} {fn}")
    print(f"  atomic read-modify-writes per fault: {total / faults:.2f}")


def main():
    args = sys.argv[1:]
    count_atomics = "--atomics" in args
    args = [a for a in args if a != "--atomics"]
    binary = args[0] if args else None
    if binary is None:
        found = sorted(glob.glob("target/release/deps/fault-*"), key=os.path.getmtime)
        found = [f for f in found if os.access(f, os.X_OK) and not f.endswith(".d")]
        if not found:
            sys.exit("no fault bench binary: cargo bench -p gmem-core --bench fault --no-run")
        binary = found[-1]
    batches = 2
    if count_atomics:
        atomics(binary, batches)
        return
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "cg.out")
        env = dict(os.environ, GMEM_FAULT_PROFILE=str(batches))
        run = subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", binary],
            env=env, capture_output=True, text=True, check=True)
        faults = int(re.search(r"profile: (\d+) faults", run.stdout).group(1))
        tree = subprocess.run(
            ["callgrind_annotate", "--inclusive=yes", "--tree=calling", "--threshold=100", out],
            capture_output=True, text=True, check=True).stdout
    funcs = parse(tree)
    root = next((f for f in funcs if re.search(r"Gmem>::dev_fault$", f)), None)
    if root is None:
        sys.exit("dev_fault not found in the profile")
    incl = funcs[root][0]
    fr = split(funcs, root, "entry", {})
    print(f"{binary}: {faults} first-touch 4 KiB faults under callgrind")
    print(f"  dev_fault total            {incl / faults:8.0f} instructions/fault")
    for s in ORDER:
        v = fr.get(s, 0.0)
        print(f"  {s:<26} {v * incl / faults:8.0f}  ({v * 100:5.1f}%)")
    core = 1.0 - sum(fr.get(s, 0.0) for s in DRIVER)
    print(f"  core (total - test driver) {core * incl / faults:8.0f}  ({core * 100:5.1f}%)")


if __name__ == "__main__":
    main()
