"""Checks the multi-node VM's serial log: the topology tierflow saw, and the tests' verdict."""
import json
import sys


def section(lines, name):
    begin = f"TIERFLOW-VM-{name}-BEGIN"
    out, inside, status = [], False, None
    for line in lines:
        if line.startswith(begin):
            inside = True
        elif line.startswith(f"TIERFLOW-VM-{name}-END"):
            status = line.split()[-1] if len(line.split()) > 1 else None
            break
        elif inside:
            out.append(line)
    return out, status


def main(path):
    lines = open(path, encoding="utf-8", errors="replace").read().splitlines()
    # Console resets and kernel messages can share a line with a marker: start at the marker.
    lines = [l[l.index("TIERFLOW-VM-"):] if "TIERFLOW-VM-" in l else l for l in lines]
    failures = []
    kernel = [l for l in lines if l.startswith("TIERFLOW-VM-KERNEL")]
    print(kernel[0] if kernel else "kernel: unknown")
    table, _ = section(lines, "TABLE")
    print("\n".join(table))

    topo_lines, status = section(lines, "TOPO")
    if status != "0":
        failures.append(f"tierflow topo --json exited {status}")
    try:
        topo = json.loads("\n".join(l for l in topo_lines if not l.startswith("[")))
    except json.JSONDecodeError as e:
        failures.append(f"tierflow topo --json printed no JSON ({e})")
        topo = {"tiers": [], "nodes": []}
    tiers = [(t["name"], t["kind"], t["nodes"]) for t in topo["tiers"]]
    want = [("dram0", "dram", [0]), ("cxl0", "cxl", [1]), ("cxl1", "cxl", [2])]
    if tiers != want:
        failures.append(f"tiers {tiers}, expected {want}")
    hmat = {(1, 0): (20000, 100), (1, 1): (5000, 300), (1, 2): (2000, 600)}
    for t in topo["tiers"]:
        if not t["nodes"]:
            continue
        node = t["nodes"][0]
        bw = t["perf"]["read_bandwidth_mbps"]
        lat = t["perf"]["read_latency_ns"]
        want_bw, want_lat = hmat[(1, node)]
        if bw["source"] != "hmat" or lat["source"] != "hmat":
            failures.append(f"{t['name']}: performance not from HMAT: {bw}, {lat}")
            continue
        # QEMU's G may be 10^9 or 2^30: accept either.
        if not (0.9 * want_bw <= bw["value"] <= 1.1 * want_bw * 1.074):
            failures.append(f"{t['name']}: read bandwidth {bw['value']} MB/s, expected ~{want_bw}")
        if lat["value"] != want_lat:
            failures.append(f"{t['name']}: read latency {lat['value']} ns, expected {want_lat}")
    verify_lines, verify_status = section(lines, "VERIFY")
    try:
        checks = json.loads("\n".join(l for l in verify_lines if not l.startswith("["))).get(
            "verify", [])
    except json.JSONDecodeError as e:
        checks = []
        failures.append(f"tierflow topo --verify printed no JSON ({e})")
    if verify_status != "0" or len(checks) != 3 or not all(c["ok"] for c in checks):
        failures.append(f"tierflow topo --verify (exit {verify_status}): {checks}")
    else:
        print("topo --verify:", ", ".join(f"{c['tier']} {c['pages_on_tier']}/{c['total_pages']}"
                                         for c in checks))
    tiers_by_node = {n["id"]: n.get("memory_tier") for n in topo["nodes"]}
    print("memory tiers by node:", tiers_by_node)

    # The demo with the Adam state on the CXL-like nodes, page by page (where()).
    demo_lines, demo_status = section(lines, "DEMO")
    try:
        demo = json.loads("\n".join(l for l in demo_lines if l.startswith("{")))
    except json.JSONDecodeError as e:
        demo = None
        failures.append(f"tierflow demo printed no JSON (exit {demo_status}): {e}")
    if demo is not None:
        if demo_status != "0" or demo.get("steps") != 4:
            failures.append(f"tierflow demo exited {demo_status} after {demo.get('steps')} steps")
        pages = demo.get("state_pages", {})
        for cls, node in (("optimizer_state", "2"), ("master_params", "1")):
            p = pages.get(cls, {})
            on = p.get("nodes", {}).get(node, 0)
            if not p.get("total") or on != p["total"]:
                failures.append(f"demo: {cls} pages {p}, expected all on node {node}")
        if not failures:
            print("demo:", {cls: pages[cls] for cls in pages}, "loss",
                  demo["loss_first"], "->", demo["loss_last"])

    test_lines, test_status = section(lines, "TESTS")
    print("\n".join(test_lines[-25:]))
    if test_status != "0":
        failures.append(f"multi-node tests exited {test_status}")

    if failures:
        print("--- the guest's serial log (last 80 lines) ---")
        print("\n".join(lines[-80:]))
        print("VM CHECK FAILED:")
        for f in failures:
            print("  -", f)
        return 1
    print("VM CHECK PASSED")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
