"""A Bayesian neural network (TensorFlow Probability) trained data-parallel on real digits.

Handwritten digits from scikit-learn (8x8 grey images as 64 features, shipped with the
package: nothing is downloaded), a fixed stratified 80/20 split with seed 0. The three dense
layers are ``tfp.layers.DenseFlipout``: every weight is a Gaussian whose mean and scale are
learnt (variational inference); the output is a ``tfp.distributions.Categorical`` and the
loss its negative log-likelihood plus the layers' KL terms (the negative ELBO per example).
TFP's layers are TF-Keras (Keras 2) layers, so the model is a ``tf_keras`` one and the script
sets TF_USE_LEGACY_KERAS=1 before TensorFlow loads: ``mldist.keras.DistributedOptimizer``
averages the gradients (it takes tf_keras optimizers), and the broadcast, metric-average and
warm-up callbacks come from ``mldist.horovod.keras`` (Horovod's API, after ``hvd.init()``), whose
callbacks are built on the Keras in use: ``mldist.keras``'s callbacks are Keras 3 callbacks,
which tf_keras's ``fit`` rejects.

Needs the extra: ``pip install "mldist[cpu,tfp]"`` and then ``pip install --no-deps tf-keras``
(scripts/bootstrap.sh does both).

Run:
    python examples/bayesian_tfp.py --epochs 3                        # one process
    mldist run -n 2 -- python examples/bayesian_tfp.py --epochs 3     # two workers

Why the KL terms are divided by the GLOBAL number of training examples, not the shard's:
the ELBO of the whole data set is sum_i log p(y_i | x_i, w) - KL(q(w) || p(w)); per example
that is the mean log-likelihood minus KL / N. Each rank computes its batch's mean NLL plus
the same KL / N, and DistributedOptimizer averages the gradients over ranks, which is the
gradient of the global batch's mean NLL plus KL / N: the single-worker objective. Dividing
by a rank's shard size (N / workers) would weigh the prior ``workers`` times too strongly:
the posterior would be pulled towards the prior (weights shrunk to zero, scales too wide),
the network would underfit, and the result would depend on the number of workers.

Each rank writes OUT/result-rank{R}.json with the per-epoch loss (averaged over ranks), the
test accuracy and negative log-likelihood of the posterior predictive (the mean of
``--samples`` stochastic forward passes), and a checksum of its trainable weights (equal on
every rank when the gradients were averaged and the start broadcast).
OUT is ``--out``: under ``mldist run`` its run directory ($MLDIST_RUN_DIR, next to the logs
and metrics), else runs/bayesian_tfp; the last line names it.
"""

from __future__ import annotations

import os

# Before TensorFlow loads: tf.keras is then tf_keras, the Keras that TFP's layers are built on.
os.environ["TF_USE_LEGACY_KERAS"] = "1"

import argparse
import hashlib
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

import mldist
import mldist.data
import mldist.keras


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=32, help="per-worker batch size")
    p.add_argument("--lr", type=float, default=5e-3, help="single-worker learning rate (scaled by workers)")
    p.add_argument("--warmup-epochs", type=int, default=1)
    p.add_argument("--hidden", type=int, default=64, help="units of each hidden layer")
    p.add_argument("--samples", type=int, default=20, help="forward passes averaged for the test predictions")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--out",
        default=os.environ.get("MLDIST_RUN_DIR") or "runs/bayesian_tfp",
        help="directory for the result files (default: mldist run's run directory, else runs/bayesian_tfp)",
    )
    return p.parse_args()


def load_digits_split(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The digits as (N, 64) floats in [0, 1], split 80/20 stratified with ``seed``."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = (digits.data / 16.0).astype("float32")
    y = digits.target.astype("int32")
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.2, stratify=y, random_state=seed)
    return x_train, y_train, x_test, y_test


def build_model(num_examples: int, hidden: int) -> Any:
    """Two DenseFlipout layers and a Categorical output; each KL term is divided by ``num_examples``."""
    import tensorflow_probability as tfp
    import tf_keras

    tfd = tfp.distributions

    def kl(q: Any, p: Any, _: Any) -> Any:
        return tfd.kl_divergence(q, p) / num_examples  # the GLOBAL training-set size (module docstring)

    return tf_keras.Sequential(
        [
            tf_keras.Input((64,)),
            tfp.layers.DenseFlipout(hidden, activation="relu", kernel_divergence_fn=kl),
            tfp.layers.DenseFlipout(hidden, activation="relu", kernel_divergence_fn=kl),
            tfp.layers.DenseFlipout(10, kernel_divergence_fn=kl),
            # As a tensor (metrics, predict) the distribution is its class probabilities.
            tfp.layers.DistributionLambda(
                lambda logits: tfd.Categorical(logits=logits),
                convert_to_tensor_fn=lambda d: d.probs_parameter(),
            ),
        ]
    )


def negative_log_likelihood(y: Any, distribution: Any) -> Any:
    import tensorflow as tf

    return -distribution.log_prob(tf.reshape(tf.cast(y, tf.int32), [-1]))


def predictive_probs(model: Any, x: np.ndarray, samples: int) -> np.ndarray:
    """The posterior predictive: class probabilities averaged over ``samples`` weight draws."""
    import tensorflow as tf

    # Each call draws new weights (Flipout); as a tensor the output distribution is its probabilities.
    draws = [tf.convert_to_tensor(model(x, training=False)).numpy() for _ in range(samples)]
    return np.asarray(np.mean(draws, axis=0))


def weights_sha256(model: Any) -> str:
    h = hashlib.sha256()
    for w in model.trainable_weights:
        h.update(np.ascontiguousarray(w.numpy()).tobytes())
    return h.hexdigest()


def main() -> None:
    args = parse_args()
    ctx = mldist.init()
    print(f"rank {ctx.rank} of {ctx.size} on {os.uname().nodename} (launcher {ctx.launcher})", flush=True)
    import tensorflow as tf
    import tf_keras

    import mldist.horovod.keras as hvd  # its callbacks are built on tf_keras's Callback (module docstring)

    hvd.init()  # the Horovod layer answers only once initialised; this reuses mldist.init()'s runtime

    # Each rank its own seed: different initial weights (BroadcastInitialState replaces them with
    # rank 0's) and different Flipout noise, which the averaged gradient then spans.
    tf_keras.utils.set_random_seed(args.seed + ctx.rank)
    x_train, y_train, x_test, y_test = load_digits_split(args.seed)
    train = mldist.data.shard(
        tf.data.Dataset.from_tensor_slices((x_train, y_train)),
        args.batch_size,
        shuffle_buffer=len(x_train),
        seed=args.seed,
    )
    model = build_model(num_examples=len(x_train), hidden=args.hidden)
    lr = mldist.keras.scale_lr(args.lr)
    opt = mldist.keras.DistributedOptimizer(tf_keras.optimizers.Adam(lr))  # averages the gradients over ranks
    model.compile(opt, negative_log_likelihood, metrics=["accuracy"])
    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),  # every rank starts from rank 0's weights
        hvd.callbacks.MetricAverageCallback(),  # the logged loss and accuracy are means over ranks
        hvd.callbacks.LearningRateWarmupCallback(lr, warmup_epochs=args.warmup_epochs),
    ]
    start = time.perf_counter()
    history = model.fit(train, epochs=args.epochs, callbacks=callbacks, verbose=2 if ctx.is_chief else 0)
    seconds = time.perf_counter() - start

    probs = predictive_probs(model, x_test, args.samples)
    accuracy = float(np.mean(probs.argmax(axis=1) == y_test))
    nll = float(-np.mean(np.log(probs[np.arange(len(y_test)), y_test] + 1e-12)))
    result = {
        "rank": ctx.rank,
        "size": ctx.size,
        "epochs": args.epochs,
        "train_examples": len(x_train),
        "loss_history": [float(v) for v in history.history["loss"]],
        "test_accuracy": accuracy,
        "test_nll": nll,
        "weights_sha256": weights_sha256(model),
        "train_seconds": round(seconds, 3),
        "engine": ctx.communication,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".result-rank{ctx.rank}.json.tmp"
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    tmp.replace(out / f"result-rank{ctx.rank}.json")
    if ctx.is_chief:
        print(
            f"{ctx.size} worker(s): test accuracy {accuracy:.4f}, predictive NLL {nll:.4f} "
            f"({args.samples} samples), {seconds:.1f} s training; results in {out}/",
            flush=True,
        )


if __name__ == "__main__":
    main()
