SPEC_NAME='spot-v5e'
RUN_NAME='spot-v5e'
JOB_USER='tpuctl'
WORKDIR_SPEC='~/job'
CODE='gs://my-bucket/code/train.tar.gz'
CHECKPOINT_DIR_SPEC='gs://my-bucket/spot-v5e'
CHECKPOINT_ROOT_SPEC='gs://my-bucket/spot-v5e'
DONE_MARKER_SPEC='gs://my-bucket/spot-v5e/tpuctl/spot-v5e/DONE'
ZONE_CLAIM_SPEC=''
WORKER_STATES_SPEC='gs://my-bucket/spot-v5e/tpuctl/spot-v5e/workers'
FRAMEWORK='orbax'
JOB_COMMAND='python3 train.py --steps 50000'
MULTISLICE=0
AUTOCHECKPOINT=0
TARGET_STEP=
SETUP_COMMANDS=(
  'python3 -m pip install --user -q -r requirements.txt'
)
JOB_ENV=(
  'SAVE_EVERY_STEPS=200'
)
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
