"""Broken copies of terraform/aws-batch that the offline suite must reject: each undoes one
property that keeps an untrusted run from turning the installation against its operator (no
root on the shared file system, containers kept from the metadata service, the ECS agent and
NFS, the manager's role limited to its own jobs and to Batch jobs). Loaded by negative.py."""

import re


def _test(Case, TF_TEST, name, file, old, new, message):
    return Case(f"aws isolation: {name}", file, old, new, "test",
                r"Test assertion failed: " + re.escape(message), TF_TEST, module="aws-batch")


def cases(Case, TF, TF_TEST):
    t = lambda *a: _test(Case, TF_TEST, *a)  # noqa: E731
    return [
        # --- the shared work dir (EFS): no root, one owner
        t("ClientRootAccess granted again", "efs.tf",
          '    actions   = ["elasticfilesystem:ClientMount", "elasticfilesystem:ClientWrite"]\n',
          '    actions   = ["elasticfilesystem:ClientMount", "elasticfilesystem:ClientWrite", '
          '"elasticfilesystem:ClientRootAccess"]\n',
          "the file system policy must not grant elasticfilesystem:ClientRootAccess"),
        t("mounting without the access point allowed", "efs.tf",
          '    condition {\n'
          '      test     = "StringEquals"\n'
          '      variable = "elasticfilesystem:AccessPointArn"\n'
          '      values   = [aws_efs_access_point.work.arn]\n'
          '    }\n', "",
          "the file system policy must allow mounting only through the access point "
          "(elasticfilesystem:AccessPointArn)"),
        t("the instances mount around the access point", "batch.tf",
          ",accesspoint=${aws_efs_access_point.work.id} 0 0", " 0 0",
          "the instances must mount the shared work dir through the access point "
          "(accesspoint= in the efs mount options)"),
        t("the access point acts as root", "efs.tf",
          "    uid = var.shared_work_dir_uid\n", "    uid = 0\n",
          "the shared work dir must be reached through an EFS access point acting as the "
          "dedicated uid:gid 61000:61000"),
        t("the access point's root directory writable by all", "efs.tf",
          '      permissions = "0755"\n', '      permissions = "0777"\n',
          "the access point's root directory must be created owned by the dedicated uid:gid, "
          "mode 0755 or 0750"),
        Case("aws isolation: the work dir's owner may be root", "variables.tf",
             "    condition     = var.shared_work_dir_uid >= 1 &&",
             "    condition     = var.shared_work_dir_uid >= 0 &&",
             "test", r"Missing expected failure.*var\.shared_work_dir_uid", TF_TEST,
             module="aws-batch"),
        # --- the metadata service, the ECS agent, NFS: out of the containers' reach
        t("metadata hop limit 2", "batch.tf",
          "    http_put_response_hop_limit = 1\n", "    http_put_response_hop_limit = 2\n",
          "the instances must require IMDSv2 tokens with a hop limit of 1"),
        Case("aws isolation: IMDSv1 allowed", "batch.tf",
             '    http_tokens                 = "required"\n',
             '    http_tokens                 = "optional"\n',
             "checkov", r"CKV_AWS_79 Ensure Instance Metadata Service Version 1 is not enabled "
                        r"\((module\.\S+\.)?aws_launch_template\.workers\)",
             ("checkov",), module="aws-batch"),
        t("the DOCKER-USER metadata rule removed", "batch.tf",
          "    ipt -A CODALAB-FORWARD -i br-+ -d 169.254.169.254/32 -j DROP\n", "",
          "containers on docker0 and br-* must be dropped on their way to the instance metadata "
          "service (169.254.169.254)"),
        t("link-local addresses open to the runs", "batch.tf",
          "    ipt -A CODALAB-FORWARD -i br-+ -d 169.254.0.0/16 -j DROP\n", "",
          "containers on docker0 and br-* must reach no link-local address (169.254.0.0/16) "
          "but Amazon DNS on port 53"),
        t("the Amazon DNS exception after the link-local drop", "batch.tf",
          "    ipt -A CODALAB-FORWARD -i br-+ -d 169.254.169.253/32 -p udp --dport 53 -j RETURN\n"
          "    ipt -A CODALAB-FORWARD -i br-+ -d 169.254.169.253/32 -p tcp --dport 53 -j RETURN\n"
          "    ipt -A CODALAB-FORWARD -i docker0 -d 169.254.0.0/16 -j DROP\n"
          "    ipt -A CODALAB-FORWARD -i br-+ -d 169.254.0.0/16 -j DROP\n",
          "    ipt -A CODALAB-FORWARD -i docker0 -d 169.254.0.0/16 -j DROP\n"
          "    ipt -A CODALAB-FORWARD -i br-+ -d 169.254.0.0/16 -j DROP\n"
          "    ipt -A CODALAB-FORWARD -i br-+ -d 169.254.169.253/32 -p udp --dport 53 -j RETURN\n"
          "    ipt -A CODALAB-FORWARD -i br-+ -d 169.254.169.253/32 -p tcp --dport 53 -j RETURN\n",
          "containers on docker0 and br-* must reach no link-local address (169.254.0.0/16) "
          "but Amazon DNS on port 53"),
        t("the rules not reached from DOCKER-USER", "batch.tf",
          "    ipt -C DOCKER-USER -j CODALAB-FORWARD 2>/dev/null || "
          "ipt -I DOCKER-USER 1 -j CODALAB-FORWARD\n", "",
          "the containers' rules must be reached from Docker's DOCKER-USER chain"),
        t("the ECS credentials endpoint open to the runs", "batch.tf",
          "    ipt -A CODALAB-INPUT -i br-+ -m conntrack --ctorigdst 169.254.0.0/16 -j DROP\n", "",
          "containers on docker0 and br-* must not reach the ECS agent's credentials endpoint "
          "(169.254.170.2, DNAT to the host) or its ports"),
        t("NFS open to the runs", "batch.tf",
          "    ipt -A CODALAB-FORWARD -i br-+ -p tcp --dport 2049 -j DROP\n", "",
          "containers on docker0 and br-* must reach no NFS server (TCP and UDP 2049)"),
        t("the ECS agent starts without the firewall", "batch.tf",
          "    Requires=codalab-container-firewall.service\n", "",
          "the firewall must be applied after every start of Docker and before the ECS agent "
          "takes jobs"),
        t("the firewall script cut short", "batch.tf",
          "    ${local.container_firewall}FIREWALL\n", "    ${local.container_firewall}\n",
          "the user data must stay one MIME multi-part shell script with the firewall script and "
          "its unit as whole here-documents"),
        # --- the manager's role
        t("PassRole without PassedToService", "iam.tf",
          '    condition {\n'
          '      test     = "StringEquals"\n'
          '      variable = "iam:PassedToService"\n'
          '      values   = ["ecs-tasks.amazonaws.com", "batch.amazonaws.com"]\n'
          '    }\n', "",
          "iam:PassRole must be conditioned on iam:PassedToService (ecs-tasks.amazonaws.com, the "
          "Batch job's containers)"),
        t("PassRole to EC2 as well", "iam.tf",
          '      values   = ["ecs-tasks.amazonaws.com", "batch.amazonaws.com"]\n',
          '      values   = ["ecs-tasks.amazonaws.com", "batch.amazonaws.com", "ec2.amazonaws.com"]\n',
          "iam:PassRole must be conditioned on iam:PassedToService (ecs-tasks.amazonaws.com, the "
          "Batch job's containers)"),
        t("TerminateJob unconditioned", "iam.tf",
          "  # A job definition may name the worker roles;",
          '  statement {\n'
          '    sid       = "TerminateAnyJob"\n'
          '    actions   = ["batch:TerminateJob"]\n'
          '    resources = ["*"]\n'
          '  }\n'
          "  # A job definition may name the worker roles;",
          "batch:TerminateJob and batch:CancelJob must be allowed only on jobs tagged "
          "codalab-worker-manager=<name>"),
        t("CancelJob on any job", "iam.tf",
          "  # A job definition may name the worker roles;",
          '  statement {\n'
          '    sid       = "CancelAnyJob"\n'
          '    actions   = ["batch:CancelJob"]\n'
          '    resources = ["arn:${local.partition}:batch:${local.region}:${local.account_id}:job/*"]\n'
          '  }\n'
          "  # A job definition may name the worker roles;",
          "batch:TerminateJob and batch:CancelJob must be allowed only on jobs tagged "
          "codalab-worker-manager=<name>"),
    ]
