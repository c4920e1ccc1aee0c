#!/bin/bash
#PBS -N mldist
#PBS -l select=2:mpiprocs=2
#PBS -l place=scatter:excl
#PBS -o /scratch/u/run/job.out
#PBS -j oe
#PBS -l walltime=1:00:00
# Written by mldist submit.
set -uo pipefail
umask 077  # what the job writes is owner-only (logs, records, outputs)
cd "$PBS_O_WORKDIR"
export MLDIST_JOB_DIR=/scratch/u/run
export MLDIST_RUN_DIR="$MLDIST_JOB_DIR/run"
export MLDIST_ATTEMPT="${MLDIST_ATTEMPT:-${SLURM_RESTART_COUNT:-0}}"
job_id="${PBS_JOBID:-local}"
export MLDIST_JOB_ID="$job_id"
mkdir -p "$MLDIST_JOB_DIR"
export MLDIST_REQUEUE_MARK="$MLDIST_JOB_DIR/.requeue-$job_id-$MLDIST_ATTEMPT"
rm -f -- "$MLDIST_REQUEUE_MARK".rank-*
mldist_cpus=$(bash -c 'c=$(lscpu -p=CORE,SOCKET 2>/dev/null | grep -v "^#" | sort -u | wc -l); a=$(nproc 2>/dev/null || echo 1); [ "$c" -gt 0 ] 2>/dev/null || c=$a; c=$((c * $1)); [ "$c" -le "$a" ] || c=$a; echo "$c"' mldist-cpus 1)  # no --cpus-per-task: the node's cores are shared among its ranks
[ "${mldist_cpus:-0}" -gt 0 ] 2>/dev/null || mldist_cpus=2
export MLDIST_CPUS_PER_TASK=$((mldist_cpus / 2 > 0 ? mldist_cpus / 2 : 1))
export OMP_NUM_THREADS=$MLDIST_CPUS_PER_TASK MLDIST_CORES_PER_TASK=$((MLDIST_CPUS_PER_TASK / 1 > 0 ? MLDIST_CPUS_PER_TASK / 1 : 1))
echo "mldist: $mldist_cpus CPUs per node (measured): $MLDIST_CPUS_PER_TASK threads for each of 2 ranks per node (--cpus-per-task sets them)"
mldist_forward=()  # Open MPI passes on only the variables -x names
for v in PATH LD_LIBRARY_PATH PYTHONPATH VIRTUAL_ENV CONDA_PREFIX APPTAINER_CACHEDIR APPTAINERENV_PYTHONPATH OMP_NUM_THREADS MLDIST_CPUS_PER_TASK MLDIST_JOB_DIR MLDIST_RUN_DIR MLDIST_ATTEMPT MLDIST_JOB_ID MLDIST_REQUEUE_MARK MLDIST_DECISION; do [ -n "${!v+x}" ] && mldist_forward+=(-x "$v"); done
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
if mldist_decision=$(python3 -m mldist.launch.batch.decided 4 openmpi 2>/dev/null); then
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
mpirun -np 4 --map-by "ppr:2:node:PE=$MLDIST_CORES_PER_TASK" --bind-to core --hostfile "$PBS_NODEFILE" ${mldist_forward[@]+"${mldist_forward[@]}"} bash -c 'r="${OMPI_COMM_WORLD_RANK:-${PALS_RANKID:-${PMI_RANK:-${ALPS_APP_PE:-${SLURM_PROCID:-0}}}}}"; l="${OMPI_COMM_WORLD_LOCAL_RANK:-${PALS_LOCAL_RANKID:-${MPI_LOCALRANKID:-${SLURM_LOCALID:-$((r % ${MLDIST_LOCAL_SIZE:-1}))}}}}"; n=$1; shift; w=(); while [ "$n" -gt 0 ]; do a=$1; shift; n=$((n - 1)); a=${a//\{rank\}/"$r"}; a=${a//\{local_rank\}/"$l"}; a=${a//\{job_id\}/"${MLDIST_JOB_ID:-}"}; a=${a//\{job_dir\}/"$MLDIST_JOB_DIR"}; w+=("$a"); done; set -- ${w[@]+"${w[@]}"} "$@"; c=""; trap '"'"'t=1; [ -n "$c" ] && kill -USR1 "$c" 2>/dev/null'"'"' USR1; trap '"'"'t=1; [ -n "$c" ] && kill -TERM "$c" 2>/dev/null'"'"' TERM; "$@" >>"$MLDIST_JOB_DIR/rank-$r.log" 2>&1 & c=$!; code=0; t=1; k=0; while [ "$t" = 1 ]; do t=0; wait "$c"; s=$?; [ "$k$s" = 1127 ] && break; code=$s; k=1; done; if [ "$code" -eq 75 ] && [ -n "${MLDIST_REQUEUE_MARK:-}" ]; then : >"$MLDIST_REQUEUE_MARK.rank-$r" && exit 0; fi; exit "$code"' mldist-rank 0 python train.py &
child=$!
trap 't=1; kill -TERM "$child" 2>/dev/null' TERM INT
code=0; t=1; k=0; while [ "$t" = 1 ]; do t=0; wait "$child"; s=$?; [ "$k$s" = 1127 ] && break; code=$s; k=1; done
if [ "$code" -eq 0 ] && [ -n "${mldist_hook:-}" ]; then python3 -m mldist.launch.batch.formed "$MLDIST_RUN_DIR/progress" 4 || code=1; fi
for mark in "$MLDIST_REQUEUE_MARK".rank-*; do
  if [ "$code" -eq 0 ] && [ -e "$mark" ]; then code=75; fi
done
echo "mldist: job step ended with exit code $code"
exit "$code"
