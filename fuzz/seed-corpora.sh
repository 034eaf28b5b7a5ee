#!/usr/bin/env bash
# Seeds the libFuzzer corpora: fuzz/seeds/<target>/ (committed, small) is copied to
# fuzz/corpus/<target>/ (ignored; libFuzzer adds its finds there).
#
#   fuzz/seed-corpora.sh              copy the committed seeds into corpus/
#   fuzz/seed-corpora.sh --regen DIR  first rebuild seeds/ from recorded apiserver responses in DIR
#                                     (tests/data/k8s-wire)
#   fuzz/seed-corpora.sh --store      first rebuild the store targets' seeds (seeds/store_*/) from
#                                     the rows of tests/golden/schema-v4.redb as this build
#                                     migrates it (store_rows.rs, run by an ignored test of
#                                     tests/store_damaged_rows.rs)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
targets="watch_line extract_meta list recording selectors continue_token
store_object_row store_log_row store_record store_key store_unpack"

if [[ "${1:-}" == "--store" ]]; then
    rm -rf "$here"/seeds/store_*
    (cd "$here/.." && STORE_SEEDS_DIR="$here/seeds" cargo test --all-features --test store_damaged_rows \
        write_fuzz_seeds -- --ignored --exact)
fi

if [[ "${1:-}" == "--regen" ]]; then
    wire=${2:?usage: seed-corpora.sh --regen DIR}
    for t in watch_line extract_meta list recording selectors continue_token; do
        rm -rf "$here/seeds/$t"
    done
    python3 - "$wire" "$here/seeds" <<'PY'
import json, os, pathlib, re, sys
wire, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
def put(target, name, data):
    d = out / target
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data if isinstance(data, bytes) else data.encode())
def body(http):
    # The body of a recorded .http response (after the blank line ending the headers).
    raw = http.read_bytes().replace(b"\r\n", b"\n")
    return raw.split(b"\n\n", 1)[1] if b"\n\n" in raw else b""
for jl in sorted(wire.glob("*.jsonl")):
    lines = [l for l in jl.read_bytes().splitlines() if l.strip()]
    # One of each event type, and the stream's first lines, keep the corpus small.
    seen = set()
    for i, l in enumerate(lines):
        t = json.loads(l).get("type")
        if t not in seen or i < 3:
            seen.add(t)
            put("watch_line", f"{jl.stem}-{i}", l)
            obj = json.loads(l).get("object")
            if obj is not None:
                put("extract_meta", f"{jl.stem}-{i}", json.dumps(obj))
    put("recording", jl.stem, b"\n".join(lines[:12]) + b"\n")
for js in sorted(wire.glob("*.json")):
    target = "list" if "list" in js.stem or "page" in js.stem else "extract_meta"
    put(target, js.stem, js.read_bytes())
for h in sorted(wire.glob("*.http")):
    b = body(h).strip()
    if not b:
        continue
    if h.stem.startswith("watch"):
        for i, l in enumerate(b.splitlines()[:3]):
            put("watch_line", f"{h.stem}-{i}", l)
        put("recording", h.stem, b + b"\n")
    else:
        put("list", h.stem, b)
# Real continue tokens (pages and the 410 body's fresh token).
for f in sorted(list(wire.glob("*.json")) + list(wire.glob("*.http"))):
    for i, tok in enumerate(re.findall(rb'"continue":\s*"([^"]+)"', f.read_bytes())):
        put("continue_token", f"{f.stem}-{i}", tok)
for i, s in enumerate(["app=web", "tier in (web,cache)", "!app", "app!=web,env",
                       "env notin (prod),app", "metadata.name=x,metadata.namespace!=y",
                       "status.phase==Running", "a.b/c-d_e=f.g"]):
    put("selectors", f"sel-{i}", s)
PY
fi

for t in $targets; do
    mkdir -p "$here/corpus/$t"
    cp "$here/seeds/$t/"* "$here/corpus/$t/"
done
du -sh "$here/seeds" "$here/corpus"
