# Security groups: nothing may connect to the workers or the manager; the shared file system
# takes NFS from the workers only.

resource "aws_security_group" "workers" {
  name        = "${var.name}-workers"
  description = "CodaLab worker instances (AWS Batch): no inbound traffic"
  vpc_id      = var.vpc_id
  tags        = local.tags
}

#trivy:ignore:AVD-AWS-0104 Workers pull the bundles' Docker images from any registry and reach the CodaLab server, AWS Batch/ECS and EFS: egress cannot be narrowed to known addresses.
resource "aws_vpc_security_group_egress_rule" "workers_all" {
  security_group_id = aws_security_group.workers.id
  description       = "Docker registries, the CodaLab server, AWS APIs, EFS"
  ip_protocol       = "-1"
  cidr_ipv4         = "0.0.0.0/0"
  tags              = local.tags
}

resource "aws_security_group" "manager" {
  name        = "${var.name}-manager"
  description = "cl-worker-manager (ECS on Fargate): no inbound traffic"
  vpc_id      = var.vpc_id
  tags        = local.tags
}

#trivy:ignore:AVD-AWS-0104 The manager calls AWS APIs (Batch, ECS, Secrets Manager, CloudWatch Logs) and the CodaLab server over HTTPS; their addresses are not fixed.
resource "aws_vpc_security_group_egress_rule" "manager_https" {
  security_group_id = aws_security_group.manager.id
  description       = "HTTPS to the CodaLab server, AWS APIs and the image registry"
  ip_protocol       = "tcp"
  from_port         = 443
  to_port           = 443
  cidr_ipv4         = "0.0.0.0/0"
  tags              = local.tags
}

resource "aws_security_group" "efs" {
  name        = "${var.name}-efs"
  description = "Shared work dir (EFS): NFS from the CodaLab worker instances only"
  vpc_id      = var.vpc_id
  tags        = local.tags
}

resource "aws_vpc_security_group_ingress_rule" "efs_from_workers" {
  security_group_id            = aws_security_group.efs.id
  description                  = "NFS from the worker instances"
  ip_protocol                  = "tcp"
  from_port                    = 2049
  to_port                      = 2049
  referenced_security_group_id = aws_security_group.workers.id
  tags                         = local.tags
}

# The CodaLab server on another port than 443 (e.g. http://codalab.internal:2900).
#trivy:ignore:AVD-AWS-0104 The CodaLab server's address is given as a URL, not as a network; only its port is open.
resource "aws_vpc_security_group_egress_rule" "manager_codalab" {
  count             = local.codalab_port == 443 ? 0 : 1
  security_group_id = aws_security_group.manager.id
  description       = "The CodaLab server's port"
  ip_protocol       = "tcp"
  from_port         = local.codalab_port
  to_port           = local.codalab_port
  cidr_ipv4         = "0.0.0.0/0"
  tags              = local.tags
}
