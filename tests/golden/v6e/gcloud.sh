gcloud alpha compute tpus queued-resources create maxtext-v6e \
    --project=my-project \
    --zone=us-central2-b \
    --accelerator-type=v6e-8 \
    --runtime-version=v2-alpha-tpuv6e \
    --node-id=maxtext-v6e \
    --valid-until-duration=12h \
    --network=tpu-net \
    --subnetwork=tpu-subnet-us-east5 \
    --internal-ips \
    --tags=tpu-training,allow-ssh-iap \
    --labels=team=llm,cost-center=research,managed-by=tpuctl,tpuctl-job=maxtext-v6e,tpuctl-spec-hash=f1f26ceba9ca,tpuctl-run=maxtext-v6e \
    --service-account=tpu-trainer@my-project.iam.gserviceaccount.com \
    --scopes=https://www.googleapis.com/auth/cloud-platform \
    --metadata-from-file=startup-script=startup.sh \
    --metadata=tpuctl-record=gs://my-bucket/maxtext-v6e/tpuctl/maxtext-v6e \
    --autocheckpoint-enabled \
    '--description=MaxText on Trillium'
