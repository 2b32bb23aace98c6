import json, sys, itertools, time, os
import torch
torch.set_num_threads(1)
from multiprocessing import Pool
from featuredp.experiments import GridConfig, GridRunner, train_cell
R = None
def init():
    global R
    torch.set_num_threads(1); os.nice(5)
    R = GridRunner(GridConfig(dataset="purchase-style", out="/tmp/fdpdiag/x", progress=False))
    R.validation
def run(job):
    method, eps, split, params = job[:4]; seed = job[4] if len(job) > 4 else 0
    base = dict(R.preset["methods"][method]); base.update(params)
    kw = {"loss_split": "zero"} if split == "zero" else {"loss_split": "padding", "padding_scale": float(split)}
    t = time.process_time()
    s = train_cell(data=R.validation, method=method, epsilon=eps, delta=R.delta, seed=seed, model="mlp", hidden=[300], **kw, **base)
    return {"method": method, "eps": eps, "split": split, "params": params, "seed": seed, "val": round(100 * s["accuracy"], 2), "sigma": round(s["noise_multiplier"] or 0, 3), "steps": s["steps"], "cpu": round(time.process_time() - t, 1)}
if __name__ == "__main__":
    jobs = json.load(open(sys.argv[1]))
    with Pool(2, initializer=init) as p, open(sys.argv[2], "a") as f:
        for r in p.imap_unordered(run, [tuple(j) for j in jobs]):
            print(json.dumps(r), flush=True); f.write(json.dumps(r) + "\n"); f.flush()
