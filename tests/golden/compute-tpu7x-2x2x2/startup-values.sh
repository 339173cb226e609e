SPEC_NAME='ironwood'
RUN_NAME='ironwood'
JOB_USER='tpuctl'
WORKDIR_SPEC='~/maxtext'
CODE=''
CHECKPOINT_DIR_SPEC='gs://my-bucket/ironwood'
CHECKPOINT_ROOT_SPEC='gs://my-bucket/ironwood/ironwood/checkpoints'
DONE_MARKER_SPEC='gs://my-bucket/ironwood/tpuctl/ironwood/DONE'
ZONE_CLAIM_SPEC=''
WORKER_STATES_SPEC='gs://my-bucket/ironwood/tpuctl/ironwood/workers'
FRAMEWORK='maxtext'
JOB_COMMAND='python3 MaxText/train.py MaxText/configs/base.yml model_name=llama2-7b per_device_batch_size=2 steps=5000 dataset_type=synthetic'
MULTISLICE=0
AUTOCHECKPOINT=0
TARGET_STEP=4999
SETUP_COMMANDS=(
  'test -d .git || git clone --depth 1 https://github.com/AI-Hypercomputer/maxtext.git .'
  'python3 -m pip install --user -q -r requirements.txt'
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
  PRESET_ARGS=(
    'run_name='"$RUN_NAME"
    'base_output_directory='"$CHECKPOINT_DIR"
    'enable_checkpointing=true'
    'async_checkpointing=true'
  )
}
