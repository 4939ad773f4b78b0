"""On the device: the trusted runner of two evaluators in a row, forked by one server."""
from pathlib import Path

from farm.corpus.tasks import ref_from_file
from farm.evaluate.evaluator import EvalSettings, Evaluator
from farm.reference.generate import generate_references, load_pt
from farm.storage import open_store
from farm.targets import resolve_device


def main():
    spec = resolve_device("cuda:0")
    store = open_store("file:///tmp/chkstore")
    task = ref_from_file(Path("tasks/demo/row_sum.py").resolve(), "demo")
    [r] = generate_references([task], store, spec, 0, "small", 300)
    assert r["success"], r
    store.get_file(r["key"], Path("/tmp/rs.pt"))
    data = load_pt(Path("/tmp/rs.pt"))
    good = Path("tests/evaluate/cheats/good_row_sum.py").read_text()
    servers = []
    for i in range(2):
        with Evaluator(task, data, spec, EvalSettings.for_device(spec)) as ev:
            res = ev.evaluate(good, "good")
            srv = ev.trusted.server
            servers.append(srv)
            print(i, res.verdict, (res.reason or "")[:200], type(ev.trusted.proc).__name__,
                  srv.read_only if srv else None, ev.boundary, res.stage_s, flush=True)
    print("same server:", servers[0] is not None and servers[0] is servers[1])


if __name__ == "__main__":
    main()
