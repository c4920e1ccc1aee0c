#!/bin/bash
#SBATCH --job-name=golden
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=4
#SBATCH --output=/scratch/u/run/job-%j.out
#SBATCH --open-mode=append
#SBATCH --cpus-per-task=8
#SBATCH --gpus-per-node=4
#SBATCH --time=2:00:00
#SBATCH --mem=64G
#SBATCH --dependency=afterok:123
#SBATCH --account=proj1
#SBATCH --partition=gpu
#SBATCH --requeue
#SBATCH --signal=B:USR1@120
# Written by mldist submit.
set -uo pipefail
umask 077  # what the job writes is owner-only (logs, records, outputs)
trap 'mldist_early_usr1=1' USR1
export MLDIST_JOB_DIR=/scratch/u/run
export MLDIST_RUN_DIR="$MLDIST_JOB_DIR/run"
export MLDIST_ATTEMPT="${MLDIST_ATTEMPT:-${SLURM_RESTART_COUNT:-0}}"
job_id="${SLURM_JOB_ID:-local}"
export MLDIST_JOB_ID="$job_id"
mkdir -p "$MLDIST_JOB_DIR"
export MLDIST_REQUEUE_MARK="$MLDIST_JOB_DIR/.requeue-$job_id-$MLDIST_ATTEMPT"
rm -f -- "$MLDIST_REQUEUE_MARK".rank-*
if ! command -v module >/dev/null 2>&1; then
  for f in /etc/profile.d/lmod.sh /etc/profile.d/modules.sh; do [ -r "$f" ] && . "$f"; done
fi
module purge
module load gcc/12.2
module load cuda/12.2
[ -r /opt/intel/vtune/amplxe-vars.sh ] || { echo "mldist: --env-source '/opt/intel/vtune/amplxe-vars.sh' is not readable on $(hostname)" >&2; exit 1; }
set +u; source /opt/intel/vtune/amplxe-vars.sh; set -u
export OMP_NUM_THREADS=8 MLDIST_CPUS_PER_TASK=8
export NCCL_DEBUG=INFO
[ -n "${CUDA_PATH+x}" ] || echo "mldist: --env XLA_FLAGS uses \$CUDA_PATH, which is not set in the job"
export XLA_FLAGS=--xla_gpu_cuda_data_dir="${CUDA_PATH-}"
[ -n "${LD_LIBRARY_PATH+x}" ] || echo "mldist: --env LD_LIBRARY_PATH uses \$LD_LIBRARY_PATH, which is not set in the job"
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH-}":/opt/intel/vtune/lib64
[ -n "${HOME+x}" ] || echo "mldist: --env RUN_NOTE uses \$HOME, which is not set in the job"
export RUN_NOTE='it'"'"'s '"${HOME-}"'; costs $5 & $(id) *'
mldist_srun_mpi=()  # srun's MPI plugin: the site default (a container: set --srun-mpi)
export APPTAINER_CACHEDIR="${APPTAINER_CACHEDIR:-${TMPDIR:-/tmp}/apptainer-cache-$(id -u)}"
mldist_sif="$MLDIST_JOB_DIR/tensorflow_tensorflow_2.16.1-gpu.sif"
if [ ! -s "$mldist_sif" ]; then  # pulled once; a requeued job (or a named cache) reuses it
  mkdir -p "$(dirname "$mldist_sif")"
  apptainer pull --force "$mldist_sif.part-$$" docker://tensorflow/tensorflow:2.16.1-gpu && mv -f "$mldist_sif.part-$$" "$mldist_sif" || { echo "mldist: cannot pull docker://tensorflow/tensorflow:2.16.1-gpu (see above)" >&2; exit 1; }
fi
mldist_binds=()
if ! apptainer exec --nv --bind "$PWD" --bind "$MLDIST_JOB_DIR" --bind /data:/mnt:ro ${mldist_binds[@]+"${mldist_binds[@]}"} --writable-tmpfs --bind /scratch/u/data:/data:ro "$mldist_sif" python3 -c 'import mldist' >/dev/null 2>&1; then
  echo 'mldist: the container has no mldist: binding' /home/u/.local/lib/python3.11/site-packages/mldist '(the mldist that submitted the job); install mldist in the image to use its own'
  mldist_binds=(--bind /home/u/.local/lib/python3.11/site-packages/mldist:/opt/mldist-host/mldist:ro)
  export APPTAINERENV_PYTHONPATH="/opt/mldist-host${PYTHONPATH:+:$PYTHONPATH}"
fi
{
  echo "# job $job_id attempt $MLDIST_ATTEMPT on $(hostname) at $(date -u +%FT%TZ)"
  echo "## modules"; command -v module >/dev/null 2>&1 && module list 2>&1
  echo "## python"; apptainer exec --nv --bind "$PWD" --bind "$MLDIST_JOB_DIR" --bind /data:/mnt:ro ${mldist_binds[@]+"${mldist_binds[@]}"} --writable-tmpfs --bind /scratch/u/data:/data:ro "$mldist_sif" python3 -c "import sys; print(sys.executable, sys.version)"
  echo "## pip freeze"; apptainer exec --nv --bind "$PWD" --bind "$MLDIST_JOB_DIR" --bind /data:/mnt:ro ${mldist_binds[@]+"${mldist_binds[@]}"} --writable-tmpfs --bind /scratch/u/data:/data:ro "$mldist_sif" python3 -m pip freeze || echo "(no pip here)"
  echo "## mldist env"; apptainer exec --nv --bind "$PWD" --bind "$MLDIST_JOB_DIR" --bind /data:/mnt:ro ${mldist_binds[@]+"${mldist_binds[@]}"} --writable-tmpfs --bind /scratch/u/data:/data:ro "$mldist_sif" python3 -m mldist env --json --no-tensorflow
} 2>&1 | sed -E \
  -e 's#([A-Za-z][A-Za-z0-9+.-]*://)[^/[:space:]"]*@#\1<redacted>@#g' \
  -e 's#"([A-Za-z0-9_]*([Tt][Oo][Kk][Ee][Nn]|[Ss][Ee][Cc][Rr][Ee][Tt]|[Pp][Aa][Ss][Ss][Ww][Oo][Rr][Dd]|[Aa][Uu][Tt][Hh])[A-Za-z0-9_]*|[A-Za-z0-9_]*(_[Kk][Ee][Yy]))": "([^"\\]|\\.)*"#"\1": "<redacted>"#g' \
  -e 's#(^|[^A-Za-z0-9_])([A-Za-z0-9_]*([Tt][Oo][Kk][Ee][Nn]|[Ss][Ee][Cc][Rr][Ee][Tt]|[Pp][Aa][Ss][Ss][Ww][Oo][Rr][Dd]|[Aa][Uu][Tt][Hh])[A-Za-z0-9_]*|[A-Za-z0-9_]*(_[Kk][Ee][Yy]))=("([^"\\]|\\.)*"?|[^="][^"]*|$)#\1\2=<redacted>#g' >"$MLDIST_JOB_DIR/environment-$job_id.txt"
# The engine, decided once here for every rank: each takes it where its facts are these (mldist env).
if mldist_decision=$(apptainer exec --nv --bind "$PWD" --bind "$MLDIST_JOB_DIR" --bind /data:/mnt:ro ${mldist_binds[@]+"${mldist_binds[@]}"} --writable-tmpfs --bind /scratch/u/data:/data:ro "$mldist_sif" python3 -m mldist.launch.batch.decided 8 srun 2>/dev/null); then
  export MLDIST_DECISION="$mldist_decision"
else
  unset MLDIST_DECISION
  echo "mldist: no engine decision to hand the ranks (${mldist_decision:-python3 has no mldist here}); each decides for itself"
fi
if [ -n "${mldist_early_usr1:-}" ]; then
  echo "mldist: USR1 came before the workers started: requeueing without starting them"; code=75
else
  srun --kill-on-bad-exit=1 --nodes=2 --ntasks=8 --ntasks-per-node=4 --cpus-per-task=8 --cpu-bind=cores --gpus-per-task=1 ${mldist_srun_mpi[@]+"${mldist_srun_mpi[@]}"} bash -c 'r="${OMPI_COMM_WORLD_RANK:-${PALS_RANKID:-${PMI_RANK:-${ALPS_APP_PE:-${SLURM_PROCID:-0}}}}}"; l="${OMPI_COMM_WORLD_LOCAL_RANK:-${PALS_LOCAL_RANKID:-${MPI_LOCALRANKID:-${SLURM_LOCALID:-$((r % ${MLDIST_LOCAL_SIZE:-1}))}}}}"; n=$1; shift; w=(); while [ "$n" -gt 0 ]; do a=$1; shift; n=$((n - 1)); a=${a//\{rank\}/"$r"}; a=${a//\{local_rank\}/"$l"}; a=${a//\{job_id\}/"${MLDIST_JOB_ID:-}"}; a=${a//\{job_dir\}/"$MLDIST_JOB_DIR"}; w+=("$a"); done; set -- ${w[@]+"${w[@]}"} "$@"; c=""; trap '"'"'t=1; [ -n "$c" ] && kill -USR1 "$c" 2>/dev/null'"'"' USR1; trap '"'"'t=1; [ -n "$c" ] && kill -TERM "$c" 2>/dev/null'"'"' TERM; "$@" >>"$MLDIST_JOB_DIR/rank-$r.log" 2>&1 & c=$!; code=0; t=1; k=0; while [ "$t" = 1 ]; do t=0; wait "$c"; s=$?; [ "$k$s" = 1127 ] && break; code=$s; k=1; done; if [ "$code" -eq 75 ] && [ -n "${MLDIST_REQUEUE_MARK:-}" ]; then : >"$MLDIST_REQUEUE_MARK.rank-$r" && exit 0; fi; exit "$code"' mldist-rank 5 nsys profile -o '{job_dir}/r{rank}' -- apptainer exec --nv --bind "$PWD" --bind "$MLDIST_JOB_DIR" --bind /data:/mnt:ro ${mldist_binds[@]+"${mldist_binds[@]}"} --writable-tmpfs --bind /scratch/u/data:/data:ro "$mldist_sif" python train.py --epochs 5 &
  child=$!
  trap 't=1; kill -TERM "$child" 2>/dev/null' TERM INT
  trap 't=1; echo "mldist: USR1: asking the workers to save and exit"; kill -USR1 "$child"' USR1
  code=0; t=1; k=0; while [ "$t" = 1 ]; do t=0; wait "$child"; s=$?; [ "$k$s" = 1127 ] && break; code=$s; k=1; done
fi
for mark in "$MLDIST_REQUEUE_MARK".rank-*; do
  if [ "$code" -eq 0 ] && [ -e "$mark" ]; then code=75; fi
done
if [ "$code" -eq 75 ]; then
  echo "mldist: workers saved and asked to be requeued (exit 75)"
  scontrol requeue "$SLURM_JOB_ID"
fi
echo "mldist: job step ended with exit code $code"
exit "$code"
