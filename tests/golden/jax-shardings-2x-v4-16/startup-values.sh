SPEC_NAME='jax-shardings-ms'
RUN_NAME='jax-shardings-ms'
JOB_USER='tpuctl'
WORKDIR_SPEC='~/maxtext'
CODE=''
CHECKPOINT_DIR_SPEC='~/checkpoints'
CHECKPOINT_ROOT_SPEC=''
DONE_MARKER_SPEC=''
ZONE_CLAIM_SPEC=''
WORKER_STATES_SPEC=''
FRAMEWORK='custom'
JOB_COMMAND='python3 pedagogical_examples/shardings.py --dcn_data_parallelism 2 --ici_fsdp_parallelism 8'
MULTISLICE=1
AUTOCHECKPOINT=0
TARGET_STEP=
SETUP_COMMANDS=(
  'test -d .git || git clone --depth 1 https://github.com/AI-Hypercomputer/maxtext.git .'
  'python3 -m pip install --user -q jax[tpu] -f https://storage.googleapis.com/jax-releases/libtpu_releases.html'
)
JOB_ENV=()
STATE_ROOT='/var/lib/tpuctl'
LOG_ROOT='/var/log/tpuctl'
CODE_READY_MARKER='.tpuctl-uploaded'
BOOT_SCRIPT=''
GRACE_SECONDS=300
NOFILE_LIMIT=1048576

# The framework preset's flags, filled in once the checkpoint dir is resolved.
preset_args() {
  PRESET_ARGS=()
}
