SPEC_NAME='flex-v6e'
RUN_NAME='flex-v6e'
JOB_USER='tpuctl'
WORKDIR_SPEC='~/job'
CODE=''
CHECKPOINT_DIR_SPEC='gs://my-bucket/flex-v6e'
CHECKPOINT_ROOT_SPEC='gs://my-bucket/flex-v6e'
DONE_MARKER_SPEC='gs://my-bucket/flex-v6e/tpuctl/flex-v6e/DONE'
ZONE_CLAIM_SPEC=''
WORKER_STATES_SPEC='gs://my-bucket/flex-v6e/tpuctl/flex-v6e/workers'
FRAMEWORK='orbax'
JOB_COMMAND='python3 train.py --steps 20000'
MULTISLICE=0
AUTOCHECKPOINT=0
TARGET_STEP=20000
SETUP_COMMANDS=(
  'python3 -m pip install --user -q "jax[tpu]" orbax-checkpoint'
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
