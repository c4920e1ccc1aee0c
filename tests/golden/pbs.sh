#!/bin/bash
#PBS -N golden
#PBS -l select=2:mpiprocs=4:ngpus=4
#PBS -l place=scatter:excl
#PBS -o /scratch/u/run/job.out
#PBS -j oe
#PBS -l walltime=2:00:00
#PBS -q prod
#PBS -A proj1
#PBS -W depend=afterok:12.pbs
#PBS -l filesystems=home:eagle
# Written by mldist submit.
set -uo pipefail
umask 077  # what the job writes is owner-only (logs, records, outputs)
cd "$PBS_O_WORKDIR"
trap 'mldist_early_usr1=1' USR1
export MLDIST_JOB_DIR=/scratch/u/run
export MLDIST_RUN_DIR="$MLDIST_JOB_DIR/run"
export MLDIST_ATTEMPT="${MLDIST_ATTEMPT:-${SLURM_RESTART_COUNT:-0}}"
job_id="${PBS_JOBID:-local}"
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
source /home/u/venvs/tf/bin/activate
mldist_cpus=$(bash -c 'c=$(lscpu -p=CORE,SOCKET 2>/dev/null | grep -v "^#" | sort -u | wc -l); a=$(nproc 2>/dev/null || echo 1); [ "$c" -gt 0 ] 2>/dev/null || c=$a; c=$((c * $1)); [ "$c" -le "$a" ] || c=$a; echo "$c"' mldist-cpus 1)  # no --cpus-per-task: the node's cores are shared among its ranks
[ "${mldist_cpus:-0}" -gt 0 ] 2>/dev/null || mldist_cpus=4
export MLDIST_CPUS_PER_TASK=$((mldist_cpus / 4 > 0 ? mldist_cpus / 4 : 1))
export OMP_NUM_THREADS=$MLDIST_CPUS_PER_TASK MLDIST_CORES_PER_TASK=$((MLDIST_CPUS_PER_TASK / 1 > 0 ? MLDIST_CPUS_PER_TASK / 1 : 1))
echo "mldist: $mldist_cpus CPUs per node (measured): $MLDIST_CPUS_PER_TASK threads for each of 4 ranks per node (--cpus-per-task sets them)"
export NCCL_DEBUG=INFO
[ -n "${CUDA_PATH+x}" ] || echo "mldist: --env XLA_FLAGS uses \$CUDA_PATH, which is not set in the job"
export XLA_FLAGS=--xla_gpu_cuda_data_dir="${CUDA_PATH-}"
[ -n "${LD_LIBRARY_PATH+x}" ] || echo "mldist: --env LD_LIBRARY_PATH uses \$LD_LIBRARY_PATH, which is not set in the job"
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH-}":/opt/intel/vtune/lib64
[ -n "${HOME+x}" ] || echo "mldist: --env RUN_NOTE uses \$HOME, which is not set in the job"
export RUN_NOTE='it'"'"'s '"${HOME-}"'; costs $5 & $(id) *'
{
  echo "# job $job_id attempt $MLDIST_ATTEMPT on $(hostname) at $(date -u +%FT%TZ)"
  echo "## modules"; command -v module >/dev/null 2>&1 && module list 2>&1
  echo "## python"; python3 -c "import sys; print(sys.executable, sys.version)"
  echo "## pip freeze"; python3 -m pip freeze || echo "(no pip here)"
  echo "## mldist env"; python3 -m mldist env --json --no-tensorflow
} 2>&1 | sed -E \
  -e 's#([A-Za-z][A-Za-z0-9+.-]*://)[^/[:space:]"]*@#\1<redacted>@#g' \
  -e 's#"([A-Za-z0-9_]*([Tt][Oo][Kk][Ee][Nn]|[Ss][Ee][Cc][Rr][Ee][Tt]|[Pp][Aa][Ss][Ss][Ww][Oo][Rr][Dd]|[Aa][Uu][Tt][Hh])[A-Za-z0-9_]*|[A-Za-z0-9_]*(_[Kk][Ee][Yy]))": "([^"\\]|\\.)*"#"\1": "<redacted>"#g' \
  -e 's#(^|[^A-Za-z0-9_])([A-Za-z0-9_]*([Tt][Oo][Kk][Ee][Nn]|[Ss][Ee][Cc][Rr][Ee][Tt]|[Pp][Aa][Ss][Ss][Ww][Oo][Rr][Dd]|[Aa][Uu][Tt][Hh])[A-Za-z0-9_]*|[A-Za-z0-9_]*(_[Kk][Ee][Yy]))=("([^"\\]|\\.)*"?|[^="][^"]*|$)#\1\2=<redacted>#g' >"$MLDIST_JOB_DIR/environment-$job_id.txt"
# The engine, decided once here for every rank: each takes it where its facts are these (mldist env).
if mldist_decision=$(python3 -m mldist.launch.batch.decided 8 pals 2>/dev/null); then
  export MLDIST_DECISION="$mldist_decision"
else
  unset MLDIST_DECISION
  echo "mldist: no engine decision to hand the ranks (${mldist_decision:-python3 has no mldist here}); each decides for itself"
fi
# The ranks' start-up hook: Keras's variables per rank, and whether each joined a group.
mldist_where='from mldist.base.joined import hook_folder; print(hook_folder())'
if mldist_hook=$(python3 -c "$mldist_where" 2>/dev/null); then
  export PYTHONPATH="$mldist_hook${PYTHONPATH:+:$PYTHONPATH}"
fi
rm -f -- "$MLDIST_RUN_DIR"/progress/group-*
if [ -n "${mldist_early_usr1:-}" ]; then
  echo "mldist: USR1 came before the workers started: requeueing without starting them"; code=75
else
  mpiexec -n 8 --ppn 4 --depth "$MLDIST_CPUS_PER_TASK" --cpu-bind depth bash -c 'r="${OMPI_COMM_WORLD_RANK:-${PALS_RANKID:-${PMI_RANK:-${ALPS_APP_PE:-${SLURM_PROCID:-0}}}}}"; l="${OMPI_COMM_WORLD_LOCAL_RANK:-${PALS_LOCAL_RANKID:-${MPI_LOCALRANKID:-${SLURM_LOCALID:-$((r % ${MLDIST_LOCAL_SIZE:-1}))}}}}"; n=$1; shift; w=(); while [ "$n" -gt 0 ]; do a=$1; shift; n=$((n - 1)); a=${a//\{rank\}/"$r"}; a=${a//\{local_rank\}/"$l"}; a=${a//\{job_id\}/"${MLDIST_JOB_ID:-}"}; a=${a//\{job_dir\}/"$MLDIST_JOB_DIR"}; w+=("$a"); done; set -- ${w[@]+"${w[@]}"} "$@"; c=""; trap '"'"'t=1; [ -n "$c" ] && kill -USR1 "$c" 2>/dev/null'"'"' USR1; trap '"'"'t=1; [ -n "$c" ] && kill -TERM "$c" 2>/dev/null'"'"' TERM; "$@" >>"$MLDIST_JOB_DIR/rank-$r.log" 2>&1 & c=$!; code=0; t=1; k=0; while [ "$t" = 1 ]; do t=0; wait "$c"; s=$?; [ "$k$s" = 1127 ] && break; code=$s; k=1; done; if [ "$code" -eq 75 ] && [ -n "${MLDIST_REQUEUE_MARK:-}" ]; then : >"$MLDIST_REQUEUE_MARK.rank-$r" && exit 0; fi; exit "$code"' mldist-rank 5 nsys profile -o '{job_dir}/r{rank}' -- python train.py --epochs 5 &
  child=$!
  trap 't=1; kill -TERM "$child" 2>/dev/null' TERM INT
  trap 't=1; echo "mldist: USR1: asking the workers to save and exit"; kill -USR1 "$child"' USR1
  code=0; t=1; k=0; while [ "$t" = 1 ]; do t=0; wait "$child"; s=$?; [ "$k$s" = 1127 ] && break; code=$s; k=1; done
fi
if [ "$code" -eq 0 ] && [ -n "${mldist_hook:-}" ]; then python3 -m mldist.launch.batch.formed "$MLDIST_RUN_DIR/progress" 8 || code=1; fi
kill "$watcher" 2>/dev/null
for mark in "$MLDIST_REQUEUE_MARK".rank-*; do
  if [ "$code" -eq 0 ] && [ -e "$mark" ]; then code=75; fi
done
if [ "$code" -eq 75 ]; then
  echo "mldist: workers saved and asked to be requeued (exit 75)"
  qsub -v MLDIST_ATTEMPT="$((MLDIST_ATTEMPT + 1))" "$MLDIST_JOB_DIR/job.sh"
fi
echo "mldist: job step ended with exit code $code"
exit "$code"
