/* zt_config.c — being written */
