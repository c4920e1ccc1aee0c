#!/bin/bash
#COBALT -n 2
#COBALT -O /scratch/u/run/job
#COBALT -t 120
#COBALT -q debug-cache-quad
#COBALT -A proj1
#COBALT --attrs mcdram=cache:numa=quad
#COBALT --dependencies 1234:1235
# Written by mldist submit.
set -uo pipefail
umask 077  # what the job writes is owner-only (logs, records, outputs)
trap 'mldist_early_usr1=1' USR1
export MLDIST_JOB_DIR=/scratch/u/run
export MLDIST_RUN_DIR="$MLDIST_JOB_DIR/run"
export MLDIST_ATTEMPT="${MLDIST_ATTEMPT:-${SLURM_RESTART_COUNT:-0}}"
job_id="${COBALT_JOBID:-local}"
export MLDIST_JOB_ID="$job_id"
mkdir -p "$MLDIST_JOB_DIR"
export MLDIST_REQUEUE_MARK="$MLDIST_JOB_DIR/.requeue-$job_id-$MLDIST_ATTEMPT"
rm -f -- "$MLDIST_REQUEUE_MARK".rank-*
( trap 'kill "$nap" 2>/dev/null; exit 0' TERM; sleep 7080 & nap=$!; wait "$nap"; kill -USR1 $$ ) & watcher=$!
if ! command -v module >/dev/null 2>&1; then
  for f in /etc/profile.d/lmod.sh /etc/profile.d/modules.sh; do [ -r "$f" ] && . "$f"; done
fi
module purge
module load gcc/12.2
module load cuda/12.2
[ -r /opt/intel/vtune/amplxe-vars.sh ] || { echo "mldist: --env-source '/opt/intel/vtune/amplxe-vars.sh' is not readable on $(hostname)" >&2; exit 1; }
set +u; source /opt/intel/vtune/amplxe-vars.sh; set -u
export OMP_NUM_THREADS=32 MLDIST_CPUS_PER_TASK=32
export NCCL_DEBUG=INFO
[ -n "${CUDA_PATH+x}" ] || echo "mldist: --env XLA_FLAGS uses \$CUDA_PATH, which is not set in the job"
export XLA_FLAGS=--xla_gpu_cuda_data_dir="${CUDA_PATH-}"
[ -n "${LD_LIBRARY_PATH+x}" ] || echo "mldist: --env LD_LIBRARY_PATH uses \$LD_LIBRARY_PATH, which is not set in the job"
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH-}":/opt/intel/vtune/lib64
[ -n "${HOME+x}" ] || echo "mldist: --env RUN_NOTE uses \$HOME, which is not set in the job"
export RUN_NOTE='it'"'"'s '"${HOME-}"'; costs $5 & $(id) *'
export APPTAINER_CACHEDIR="${APPTAINER_CACHEDIR:-${TMPDIR:-/tmp}/apptainer-cache-$(id -u)}"
mldist_binds=()
{
  echo "# job $job_id attempt $MLDIST_ATTEMPT on $(hostname) at $(date -u +%FT%TZ)"
  echo "## modules"; command -v module >/dev/null 2>&1 && module list 2>&1
  echo "## python"; apptainer exec --bind "$PWD" --bind "$MLDIST_JOB_DIR" ${mldist_binds[@]+"${mldist_binds[@]}"} /sw/images/tf.sif python3 -c "import sys; print(sys.executable, sys.version)"
  echo "## pip freeze"; apptainer exec --bind "$PWD" --bind "$MLDIST_JOB_DIR" ${mldist_binds[@]+"${mldist_binds[@]}"} /sw/images/tf.sif python3 -m pip freeze || echo "(no pip here)"
  echo "## mldist env"; apptainer exec --bind "$PWD" --bind "$MLDIST_JOB_DIR" ${mldist_binds[@]+"${mldist_binds[@]}"} /sw/images/tf.sif python3 -m mldist env --json --no-tensorflow
} 2>&1 | sed -E \
  -e 's#([A-Za-z][A-Za-z0-9+.-]*://)[^/[:space:]"]*@#\1<redacted>@#g' \
  -e 's#"([A-Za-z0-9_]*([Tt][Oo][Kk][Ee][Nn]|[Ss][Ee][Cc][Rr][Ee][Tt]|[Pp][Aa][Ss][Ss][Ww][Oo][Rr][Dd]|[Aa][Uu][Tt][Hh])[A-Za-z0-9_]*|[A-Za-z0-9_]*(_[Kk][Ee][Yy]))": "([^"\\]|\\.)*"#"\1": "<redacted>"#g' \
  -e 's#(^|[^A-Za-z0-9_])([A-Za-z0-9_]*([Tt][Oo][Kk][Ee][Nn]|[Ss][Ee][Cc][Rr][Ee][Tt]|[Pp][Aa][Ss][Ss][Ww][Oo][Rr][Dd]|[Aa][Uu][Tt][Hh])[A-Za-z0-9_]*|[A-Za-z0-9_]*(_[Kk][Ee][Yy]))=("([^"\\]|\\.)*"?|[^="][^"]*|$)#\1\2=<redacted>#g' >"$MLDIST_JOB_DIR/environment-$job_id.txt"
# The engine, decided once here for every rank: each takes it where its facts are these (mldist env).
if mldist_decision=$(apptainer exec --bind "$PWD" --bind "$MLDIST_JOB_DIR" ${mldist_binds[@]+"${mldist_binds[@]}"} /sw/images/tf.sif python3 -m mldist.launch.batch.decided 8 aprun 2>/dev/null); then
  export MLDIST_DECISION="$mldist_decision"
else
  unset MLDIST_DECISION
  echo "mldist: no engine decision to hand the ranks (${mldist_decision:-python3 has no mldist here}); each decides for itself"
fi
if [ -n "${mldist_early_usr1:-}" ]; then
  echo "mldist: USR1 came before the workers started: requeueing without starting them"; code=75
else
  aprun -n 8 -N 4 -d 32 -j 2 -cc depth -e MLDIST_SIZE=8 -e MLDIST_LOCAL_SIZE=4 -e OMP_NUM_THREADS=32 -e NCCL_DEBUG=INFO -e "XLA_FLAGS=$XLA_FLAGS" -e "LD_LIBRARY_PATH=$LD_LIBRARY_PATH" -e "RUN_NOTE=$RUN_NOTE" bash -c 'r="${OMPI_COMM_WORLD_RANK:-${PALS_RANKID:-${PMI_RANK:-${ALPS_APP_PE:-${SLURM_PROCID:-0}}}}}"; l="${OMPI_COMM_WORLD_LOCAL_RANK:-${PALS_LOCAL_RANKID:-${MPI_LOCALRANKID:-${SLURM_LOCALID:-$((r % ${MLDIST_LOCAL_SIZE:-1}))}}}}"; n=$1; shift; w=(); while [ "$n" -gt 0 ]; do a=$1; shift; n=$((n - 1)); a=${a//\{rank\}/"$r"}; a=${a//\{local_rank\}/"$l"}; a=${a//\{job_id\}/"${MLDIST_JOB_ID:-}"}; a=${a//\{job_dir\}/"$MLDIST_JOB_DIR"}; w+=("$a"); done; set -- ${w[@]+"${w[@]}"} "$@"; c=""; trap '"'"'t=1; [ -n "$c" ] && kill -USR1 "$c" 2>/dev/null'"'"' USR1; trap '"'"'t=1; [ -n "$c" ] && kill -TERM "$c" 2>/dev/null'"'"' TERM; "$@" >>"$MLDIST_JOB_DIR/rank-$r.log" 2>&1 & c=$!; code=0; t=1; k=0; while [ "$t" = 1 ]; do t=0; wait "$c"; s=$?; [ "$k$s" = 1127 ] && break; code=$s; k=1; done; if [ "$code" -eq 75 ] && [ -n "${MLDIST_REQUEUE_MARK:-}" ]; then : >"$MLDIST_REQUEUE_MARK.rank-$r" && exit 0; fi; exit "$code"' mldist-rank 5 nsys profile -o '{job_dir}/r{rank}' -- apptainer exec --bind "$PWD" --bind "$MLDIST_JOB_DIR" ${mldist_binds[@]+"${mldist_binds[@]}"} /sw/images/tf.sif python train.py --epochs 5 &
  child=$!
  trap 't=1; kill -TERM "$child" 2>/dev/null' TERM INT
  trap 't=1; echo "mldist: USR1: asking the workers to save and exit"; kill -USR1 "$child"' USR1
  code=0; t=1; k=0; while [ "$t" = 1 ]; do t=0; wait "$child"; s=$?; [ "$k$s" = 1127 ] && break; code=$s; k=1; done
fi
kill "$watcher" 2>/dev/null
for mark in "$MLDIST_REQUEUE_MARK".rank-*; do
  if [ "$code" -eq 0 ] && [ -e "$mark" ]; then code=75; fi
done
if [ "$code" -eq 75 ]; then
  echo "mldist: workers saved and asked to be requeued (exit 75)"
  qsub --env MLDIST_ATTEMPT="$((MLDIST_ATTEMPT + 1))" "$MLDIST_JOB_DIR/job.sh"
fi
echo "mldist: job step ended with exit code $code"
exit "$code"
