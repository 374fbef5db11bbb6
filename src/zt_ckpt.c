/* zt_ckpt.c — being written */
