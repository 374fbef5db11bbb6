/* zt_data.c — being written */
