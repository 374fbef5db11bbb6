/* zt_log.c — being written */
