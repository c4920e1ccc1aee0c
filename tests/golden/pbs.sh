#!/bin/bash
#PBS -N golden
#PBS -l select=2:ncpus=32:mpiprocs=4:ngpus=4
#PBS -l place=scatter
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
export MLDIST_JOB_DIR=/scratch/u/run
export MLDIST_RUN_DIR="$MLDIST_JOB_DIR/run"
export MLDIST_ATTEMPT="${MLDIST_ATTEMPT:-${SLURM_RESTART_COUNT:-0}}"
job_id="${PBS_JOBID:-local}"
mkdir -p "$MLDIST_JOB_DIR"
export MLDIST_REQUEUE_MARK="$MLDIST_JOB_DIR/.requeue-$job_id-$MLDIST_ATTEMPT"
rm -f -- "$MLDIST_REQUEUE_MARK".rank-*
if ! command -v module >/dev/null 2>&1; then
  for f in /etc/profile.d/lmod.sh /etc/profile.d/modules.sh; do [ -r "$f" ] && . "$f"; done
fi
module purge
module load gcc/12.2
module load cuda/12.2
source /home/u/venvs/tf/bin/activate
export OMP_NUM_THREADS=8 MLDIST_CPUS_PER_TASK=8
export NCCL_DEBUG=INFO
export RUN_NOTE='it'"'"'s $HOME'
{
  echo "# job $job_id attempt $MLDIST_ATTEMPT on $(hostname) at $(date -u +%FT%TZ)"
  echo "## modules"; command -v module >/dev/null 2>&1 && module list 2>&1
  echo "## python"; python3 -c "import sys; print(sys.executable, sys.version)"
  echo "## pip freeze"; python3 -m pip freeze
  echo "## mldist env"; python3 -m mldist env --json --no-tensorflow
} 2>&1 | sed -E \
  -e 's#([A-Za-z][A-Za-z0-9+.-]*://)[^/[:space:]"]*@#\1<redacted>@#g' \
  -e 's#"([A-Za-z0-9_]*([Tt][Oo][Kk][Ee][Nn]|[Ss][Ee][Cc][Rr][Ee][Tt]|[Pp][Aa][Ss][Ss][Ww][Oo][Rr][Dd]|[Aa][Uu][Tt][Hh])[A-Za-z0-9_]*|[A-Za-z0-9_]*(_[Kk][Ee][Yy]))": "([^"\\]|\\.)*"#"\1": "<redacted>"#g' \
  -e 's#(^|[^A-Za-z0-9_])([A-Za-z0-9_]*([Tt][Oo][Kk][Ee][Nn]|[Ss][Ee][Cc][Rr][Ee][Tt]|[Pp][Aa][Ss][Ss][Ww][Oo][Rr][Dd]|[Aa][Uu][Tt][Hh])[A-Za-z0-9_]*|[A-Za-z0-9_]*(_[Kk][Ee][Yy]))=("([^"\\]|\\.)*"?|[^="][^"]*|$)#\1\2=<redacted>#g' >"$MLDIST_JOB_DIR/environment-$job_id.txt"
( trap 'kill "$nap" 2>/dev/null; exit 0' TERM; sleep 7080 & nap=$!; wait "$nap"; kill -USR1 $$ ) & watcher=$!
mpiexec -n 8 --ppn 4 --depth 8 --cpu-bind depth bash -c 'r="${OMPI_COMM_WORLD_RANK:-${PALS_RANKID:-${PMI_RANK:-${ALPS_APP_PE:-${SLURM_PROCID:-0}}}}}"; c=""; trap '"'"'t=1; [ -n "$c" ] && kill -USR1 "$c" 2>/dev/null'"'"' USR1; trap '"'"'t=1; [ -n "$c" ] && kill -TERM "$c" 2>/dev/null'"'"' TERM; "$@" >>"$MLDIST_JOB_DIR/rank-$r.log" 2>&1 & c=$!; code=0; t=1; while [ "$t" = 1 ]; do t=0; wait "$c"; s=$?; [ "$s" -eq 127 ] && break; code=$s; done; if [ "$code" -eq 75 ] && [ -n "${MLDIST_REQUEUE_MARK:-}" ]; then : >"$MLDIST_REQUEUE_MARK.rank-$r" && exit 0; fi; exit "$code"' mldist-rank python train.py --epochs 5 &
child=$!
trap 't=1; kill -TERM "$child" 2>/dev/null' TERM INT
trap 't=1; echo "mldist: USR1: asking the workers to save and exit"; kill -USR1 "$child"' USR1
code=0; t=1; while [ "$t" = 1 ]; do t=0; wait "$child"; s=$?; [ "$s" -eq 127 ] && break; code=$s; done
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
