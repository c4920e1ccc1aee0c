#!/bin/bash
#COBALT -n 2
#COBALT -O /scratch/u/run/job
#COBALT -t 60
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
( trap 'kill "$nap" 2>/dev/null; exit 0' TERM; sleep 3510 & nap=$!; wait "$nap"; kill -USR1 $$ ) & watcher=$!
source /home/u/venvs/tf/bin/activate
mldist_cpus=$(aprun -n 1 -N 1 -cc none bash -c 'c=$(lscpu -p=CORE,SOCKET 2>/dev/null | grep -v "^#" | sort -u | wc -l); a=$(nproc 2>/dev/null || echo 1); [ "$c" -gt 0 ] 2>/dev/null || c=$a; c=$((c * $1)); [ "$c" -le "$a" ] || c=$a; echo "$c"' mldist-cpus 1)  # no --cpus-per-task: the node's cores are shared among its ranks
[ "${mldist_cpus:-0}" -gt 0 ] 2>/dev/null || mldist_cpus=1
export MLDIST_CPUS_PER_TASK=$((mldist_cpus / 1 > 0 ? mldist_cpus / 1 : 1))
export OMP_NUM_THREADS=$MLDIST_CPUS_PER_TASK MLDIST_CORES_PER_TASK=$((MLDIST_CPUS_PER_TASK / 1 > 0 ? MLDIST_CPUS_PER_TASK / 1 : 1))
echo "mldist: $mldist_cpus CPUs per node (measured): $MLDIST_CPUS_PER_TASK threads for each of 1 ranks per node (--cpus-per-task sets them)"
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
if mldist_decision=$(python3 -m mldist.launch.batch.decided 2 aprun 2>/dev/null); then
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
# --stage-env: the environment on node-local storage, read from the shared file system once per node
mldist_stage_src=/home/u/venvs/tf
mldist_stage=/local/scratch/mldist-env-"$job_id"
mldist_stage_tar="$MLDIST_JOB_DIR/env-stage.tar"
if [ -z "$mldist_stage_src" ] || [ ! -d "$mldist_stage_src/bin" ]; then
  echo "mldist: --stage-env: $mldist_stage_src is no environment here (no bin/); give --venv or --conda" >&2
  exit 2
fi
mldist_t0=$SECONDS
if [ ! -s "$mldist_stage_tar" ]; then  # packed once; a requeued attempt reuses it
  tar -C "$mldist_stage_src" -cf "$mldist_stage_tar.part-$$" . && mv -f "$mldist_stage_tar.part-$$" "$mldist_stage_tar" || { echo "mldist: --stage-env: cannot pack $mldist_stage_src into $mldist_stage_tar" >&2; exit 2; }
fi
aprun -n 2 -N 1 -cc none bash -c 'd=$1; a=$2; old=$3; h=$(hostname); say() { echo "mldist: --stage-env on $h: $*" >&2; }; rm -rf -- "$d" "$d.part"; mkdir -p -- "$d.part" 2>/dev/null || { say "cannot create $d.part: give --stage-to a node-local directory you can write (tmp, shm or a path)"; exit 2; }; tar -C "$d.part" -xf "$a" || { say "cannot unpack $a into $d.part (is it full?)"; rm -rf -- "$d.part"; exit 2; }; for f in "$d.part"/bin/*; do [ -f "$f" ] && [ ! -L "$f" ] || continue; [ "$(head -c 2 "$f")" = "#!" ] || continue; IFS= read -r first <"$f" 2>/dev/null || true; case "$first" in "#!$old/bin/"*) { printf "%s\n" "#!$d/bin/${first#"#!$old/bin/"}"; tail -n +2 "$f"; } >"$f.mldist" && chmod --reference="$f" "$f.mldist" && mv -f "$f.mldist" "$f";; esac; done; for sp in "$d.part"/lib/python3*/site-packages; do s="$sp/mldist/launch/batch/listed_once.py"; if [ -f "$s" ]; then cp -- "$s" "$sp/_mldist_listed_once.py" && echo "import _mldist_listed_once" >"$sp/_mldist_listed_once.pth"; fi; done; mv -- "$d.part" "$d" || { say "cannot rename $d.part to $d"; exit 2; }; if [ "$4" = 1 ]; then rm -f -- "$a"; fi' mldist-unpack "$mldist_stage" "$mldist_stage_tar" "$mldist_stage_src" 0 || exit 2
echo "mldist: staged $mldist_stage_src at $mldist_stage on every node in $((SECONDS - mldist_t0)) s"
if [ -n "${mldist_early_usr1:-}" ]; then
  echo "mldist: USR1 came before the workers started: requeueing without starting them"; code=75
else
  aprun -n 2 -N 1 -d "$MLDIST_CPUS_PER_TASK" -j 1 -cc depth -e MLDIST_SIZE=2 -e MLDIST_LOCAL_SIZE=1 -e "OMP_NUM_THREADS=$MLDIST_CPUS_PER_TASK" bash -c 'r="${OMPI_COMM_WORLD_RANK:-${PALS_RANKID:-${PMI_RANK:-${ALPS_APP_PE:-${SLURM_PROCID:-0}}}}}"; l="${OMPI_COMM_WORLD_LOCAL_RANK:-${PALS_LOCAL_RANKID:-${MPI_LOCALRANKID:-${SLURM_LOCALID:-$((r % ${MLDIST_LOCAL_SIZE:-1}))}}}}"; n=$1; shift; w=(); while [ "$n" -gt 0 ]; do a=$1; shift; n=$((n - 1)); a=${a//\{rank\}/"$r"}; a=${a//\{local_rank\}/"$l"}; a=${a//\{job_id\}/"${MLDIST_JOB_ID:-}"}; a=${a//\{job_dir\}/"$MLDIST_JOB_DIR"}; w+=("$a"); done; set -- ${w[@]+"${w[@]}"} "$@"; c=""; trap '"'"'t=1; [ -n "$c" ] && kill -USR1 "$c" 2>/dev/null'"'"' USR1; trap '"'"'t=1; [ -n "$c" ] && kill -TERM "$c" 2>/dev/null'"'"' TERM; "$@" >>"$MLDIST_JOB_DIR/rank-$r.log" 2>&1 & c=$!; code=0; t=1; k=0; while [ "$t" = 1 ]; do t=0; wait "$c"; s=$?; [ "$k$s" = 1127 ] && break; code=$s; k=1; done; if [ "$code" -eq 75 ] && [ -n "${MLDIST_REQUEUE_MARK:-}" ]; then : >"$MLDIST_REQUEUE_MARK.rank-$r" && exit 0; fi; exit "$code"' mldist-rank 0 /bin/bash -c 'd=$1; old=$2; shift 2; for v in PATH PYTHONPATH LD_LIBRARY_PATH; do [ -n "${!v:-}" ] || continue; p=":${!v}:"; p=${p//":$old/"/":$d/"}; p=${p//":$old:"/":$d:"}; p=${p#:}; export "$v=${p%:}"; done; case ":$PATH:" in *":$d/bin:"*) ;; *) export PATH="$d/bin:$PATH";; esac; if [ -e "$d/pyvenv.cfg" ]; then export VIRTUAL_ENV="$d"; fi; if [ -d "$d/conda-meta" ]; then export CONDA_PREFIX="$d"; fi; exec "$@"' mldist-staged "$mldist_stage" "$mldist_stage_src" python train.py &
  child=$!
  trap 't=1; kill -TERM "$child" 2>/dev/null' TERM INT
  trap 't=1; echo "mldist: USR1: asking the workers to save and exit"; kill -USR1 "$child"' USR1
  code=0; t=1; k=0; while [ "$t" = 1 ]; do t=0; wait "$child"; s=$?; [ "$k$s" = 1127 ] && break; code=$s; k=1; done
fi
aprun -n 2 -N 1 -cc none bash -c 'rm -rf -- "$1"' mldist-unstage "$mldist_stage" >/dev/null 2>&1 || true
if [ "$code" -eq 0 ] && [ -n "${mldist_hook:-}" ]; then python3 -m mldist.launch.batch.formed "$MLDIST_RUN_DIR/progress" 2 || code=1; fi
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
